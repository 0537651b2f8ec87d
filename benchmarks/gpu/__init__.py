"""The GPU device check (``device_check.py``): one command that measures jaxgen on a lent GPU."""
