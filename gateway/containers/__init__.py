"""Containers for ``code_interpreter`` (issue 34): the Containers API's records and the registry."""
