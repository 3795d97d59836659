"""The host-assisted clone source (``python -m cloner``): reads the source volume and streams
it over mutual TLS to the upload server on the target claim (``docs/controller.md``)."""
