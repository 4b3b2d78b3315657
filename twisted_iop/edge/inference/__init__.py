"""The Edge's request path: the OpenAI-compatible API, the gateway that admits, forwards and
streams each request, whether it may be admitted, its lifecycle, error rules, latency recording and token counts.
"""
