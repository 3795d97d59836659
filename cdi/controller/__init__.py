"""The control plane's reconcilers: one per primary kind (DataVolume, upload-annotated PVC,
the three populators' claims, DataImportCron, DataSource, StorageProfile, CDIConfig).

Pure parts (``policy``, ``record``, ``status``, ``progress`` parsing, ``pods``) decide; the
reconcilers (``datavolume`` above all) read state from informer caches, call them, and apply
the result through the one Kubernetes gateway (``cdi.kube``). What fills a DataVolume's claim
depends on its source and lives behind one protocol in ``flavours`` (import, upload, clone);
a claim that names a CDI source in ``dataSourceRef`` is filled by ``populators`` instead.
Each reconciler module declares what wakes its reconciler (``cdi.kube.watches``); ``manager``
composes them: one shared informer per kind (``caches``), one work queue per reconciler fed by
its declarations, workers and leader election, into a process.
"""
