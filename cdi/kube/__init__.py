"""The Kubernetes gateway: the only code that talks to the ``kubernetes`` client (``client``),
typed API errors (``errors``), and the machinery controllers are built from: informers, a keyed
rate-limited work queue, Lease leader election, an event recorder."""
