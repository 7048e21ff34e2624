"""Records and audit: every pool's record, the named pools' audit trail, and the package lock
that makes a pool reproducible."""
