"""Business rules of the registry. Services take a session and flush; the request commits."""
