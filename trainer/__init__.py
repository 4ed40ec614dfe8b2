"""The trainer process: exports the encoder, trains adapter and router, builds and publishes index versions.

torch lives here and only here; the gateway never imports this package.
"""
