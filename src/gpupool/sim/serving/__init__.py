"""Prefill/decode LLM serving in the simulator: instances placed on the pool, KV caches on the fabric."""
