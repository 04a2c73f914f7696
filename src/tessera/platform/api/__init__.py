"""The platform's interface: the in-process Platform (sdk), its inputs, and the HTTP client."""
