"""The HTTP site every listener uses: guarded sites (deadlines, caps, body limits, browser rules), the
access log with secrets redacted, and the methods each route serves.
"""
