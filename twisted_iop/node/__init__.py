"""The Node runtime: edge connector and provider probes."""
