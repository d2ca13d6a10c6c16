"""Use cases of the control plane; the routers call these and nothing else touches ORM rows."""
