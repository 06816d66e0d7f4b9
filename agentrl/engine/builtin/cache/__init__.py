"""Inference stage, the built-in engine's key/value storage.

`slot_cache.py`: one preallocated slot of keys and values per batch row, written by every pass and
read in place by attention. `prefix_cache.py`: blocks of keys and values of prompts seen before;
in one `generate()` call it copies the prompt's already-seen start into the request's slot, so
only the rest is prefilled. `host_copy.py`: host values to the device without waiting for the
work queued before the copy.
"""
