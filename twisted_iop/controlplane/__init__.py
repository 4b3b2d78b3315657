"""The Control Plane: edge wire server, registry, HTTP views, client wire."""
