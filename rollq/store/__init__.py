"""How rollq keeps its data in Redis: the one owner of key names and the formats inside keys, the Lua
transitions (their scripts, typed replies and stats), task records, resources versions, the reaper, and connections.

It imports :mod:`rollq.models` and nothing else of rollq; the producer and the worker both build on it.
"""
