"""AL 1.0's HTTP routes, one module per resource, each adding its routes to an aiohttp router."""
