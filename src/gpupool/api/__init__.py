"""The HTTP API's vocabulary, shared by the server, the client and remote functions: the request and
response models (kept apart from the core domain models), the reasons the server records with a
workload's change of state (`events.py`) and the one catalogue that explains every reason code
(`reasons.py`). It imports only `core` and `errors`, never the server (tests/test_layering.py)."""
