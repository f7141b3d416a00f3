"""Everything between Responses items and token ids: engines, renderers, parsers, the model registry."""
