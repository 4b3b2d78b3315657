"""Talking to inference engines: one adapter per provider kind (:mod:`.base`, :mod:`.kinds`),
the HTTP/1.1 client and its pools (:mod:`.client`, :mod:`.http`), the request body and the
answer's reader (:mod:`.stream`), health probes and load readings (:mod:`.probes`, :mod:`.readings`).
"""
