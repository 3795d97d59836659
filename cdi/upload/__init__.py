"""Upload control plane: signed upload tokens, the UploadTokenRequest aggregated API and the
upload proxy (``docs/upload.md``). The upload server pod itself lives in ``uploader/``."""
