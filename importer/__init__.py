"""The importer: streams a disk image from a source into a file or block volume."""
