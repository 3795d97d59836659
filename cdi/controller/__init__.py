"""The control plane's reconcilers: one per primary kind (today: DataVolume import and blank).

Pure parts (``policy``, ``record``, ``status``, ``progress`` parsing, ``pods``) decide; the
reconciler (``datavolume``) reads state from informer caches, calls them, and applies the
result through the one Kubernetes gateway (``cdi.kube``). What fills a claim depends on the
DataVolume's source and lives behind one protocol in ``flavours`` (import now; upload and
clone next). ``manager`` wires informers, the work
queue, workers and leader election into a process.
"""
