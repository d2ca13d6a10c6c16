"""The services' data plane: requests to /s/<service>/... reach that service's ready replicas.

HAProxy (haproxy.py) is the router when it is installed: the pool writes its configuration under the
data directory, supervises the process and changes replicas and tokens only through its runtime API.
Without it, the in-process proxy (proxy.py) serves the same routes with the same answers. Either way
a request for a service with no ready replica is held by the activator (proxy.py) until one is
ready or the cold-start limit passes.
"""
