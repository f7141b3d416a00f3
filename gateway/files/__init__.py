"""Files and vector stores: what ``file_search`` searches (``gateway.files.files``: the Files API's
service; storage and the chunk index live in ``cache.files``)."""
