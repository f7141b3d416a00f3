"""Who may ask, and how much: bearer keys to principals (``auth``), per-key rate and connection
limits as the transports apply them (``limits``). The buckets and key stores are ``security/``."""
