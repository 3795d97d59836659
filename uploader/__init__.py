"""Upload server pod (data plane): CDI's upload endpoints over the shared data path
(``datapath``), with tus resume; see docs/upload.md and docs/architecture.md."""
