"""Request and response models of the HTTP API, kept apart from the core domain models."""
