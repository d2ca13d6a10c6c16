"""The HTTP API's vocabulary, shared by the server, the client and remote functions: the request and
response models, kept apart from the core domain models."""
