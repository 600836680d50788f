"""Redis plumbing, private as a package: the command batcher, the Lua scripts (``lua/``,
loaded once and called by SHA), the key layout and the Redis lease backend."""
