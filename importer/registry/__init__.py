"""The containerDisk registry client: distribution API v2 on the importer's HTTP client.

``reference`` parses ``docker://`` URLs, ``auth`` answers ``WWW-Authenticate`` challenges
(Basic and the Bearer token flow), ``client`` fetches manifests and small blobs with digest
checks, ``manifest`` reads Docker schema 2 and OCI manifests and indexes, ``layers`` walks the
image's layers top-down to the one disk file under ``disk/``. ``importer.sources.registry`` puts
them together behind the data path's ``Source`` protocol.
"""
