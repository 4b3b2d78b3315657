"""Wire test kit: frame codecs, envelope helpers, and the scripted Edge, fake Control Plane and typed fake
peers the protocol tests drive.
"""
