"""`run --gpus`: one engine per GPU of a host, each in a child process, from one command.

`plan.py` (pure: which devices, which child does which ids, whether a stopped child is restarted)
and `supervise.py` (starting, watching and restarting the children; one progress stream and one
summary) run in the parent; `child.py` is what each child runs: the plain `run()` over its part of
the id hash (`--num-shards` x GPUs), into the same output folder under its own writer prefix.
"""
