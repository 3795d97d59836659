"""The clone flavour: a DataVolume filled from a PVC or a VolumeSnapshot (``source.pvc``,
``source.snapshot``, or ``sourceRef`` to a DataSource naming either), in its namespace or another.

A clone decides its target claim from the source (size, strategy, ``dataSource`` or a moved
volume), so it works mostly before the claim exists, in ``before_claim``, which the reconciler
calls instead of creating the rendered claim; each call takes one step and says what it saw:

1. resolve the source (through the DataSource and one it references); none yet: Bound False
   ``CloneWithoutSource`` "The source pvc|snapshot <x> doesn't exist" (then proceed when it
   appears; a cluster without the snapshot API answers 404, which is the same "doesn't exist");
2. authorize (``auth``): a cross-namespace clone needs a requester record the webhook
   signed and, now, the rights CDI asks for in the source namespace. Nothing of the source is
   read before this;
3. wait until the source is populated (its DataVolume Succeeded; a snapshot ``readyToUse``)
   and no running pod writes a source claim (event ``CloneSourceInUse``, phase CloneScheduled);
4. size: ``storage`` without a size takes the source's (a snapshot's ``restoreSize``); a
   smaller target is ``ErrIncompatiblePVC`` with CDI's message; content types must match;
5. strategy (``cdi.render.clone.plan_strategy``): the target profile's (none: ``snapshot``), or
   ``copy`` with CDI's fallback reason (annotation ``cloneFallbackReason`` and an event);
   ``snapshot`` needs a VolumeSnapshotClass for the provisioner (``snapshot``, event
   ``VolumeSnapshotClassSelected``), else ``NoVolumeSnapshotClass``;
6. ``csi-clone``: same namespace, the claim is created with ``dataSource`` = the source;
   across namespaces, ``move.VolumeMove`` clones in the source namespace and moves the
   volume, then the claim is created bound to it (phases CSICloneInProgress,
   NamespaceTransferInProgress). ``snapshot`` (smart clone): ``tmp-snapshot-<dv uid>`` of the
   source (SnapshotForSmartCloneInProgress), then a claim restored from it
   (CloneFromSnapshotSourceInProgress): the target itself in the same namespace, else a
   temporary claim whose volume moves. A snapshot source is restored the same way; when its
   driver, volume mode or size rule out a restore, it is restored as CDI's
   ``tmp-source-pvc-<dv uid>`` on a class of its driver and copied from (host-assisted, with
   CDI's fallback reason), the restored claim deleted once the copy is recorded.
   ``copy`` (host-assisted): the claim is created as rendered (``cloneType: copy``) and filled
   by ``copy.HostAssistedCopy`` (an upload server on it, a source pod beside the source),
   which works across classes, volume modes and sizes.

``sync`` (``flavour.CloneFlavour``) then takes a copy's next step, or waits for the bind, ends
a move, grows a restored claim and deletes the temporary snapshot, and records "Clone Complete".

Which strategy (CDI's planner; pure rules ``cdi.render.clone.plan_strategy`` for a PVC source,
``cdi.render.clone_snapshot.plan_snapshot_source`` for a snapshot source). The first row that
matches decides; a fallback to ``copy`` sets the claim's ``cloneFallbackReason`` and emits a
Warning event with CDI's reason:

    source    storage                                     strategy   fallback reason
    --------  ------------------------------------------  ---------  ------------------------
    PVC       profile's cloneStrategy is copy             copy       (none: asked for)
    PVC       snapshot (the profile's, or no profile),    copy       NoVolumeSnapshotClass
              no VolumeSnapshotClass for the classes'
              one provisioner (or no snapshot API)
    PVC       source and target classes' provisioners     copy       IncompatibleProvisioners
              differ (or a class is missing)
    PVC       source and target volume modes differ       copy       IncompatibleVolumeModes
    PVC       target bigger, its class not expandable     copy       NoVolumeExpansion
    PVC       otherwise, profile's csi-clone              csi-clone
    PVC       otherwise                                   snapshot
    snapshot  target class's provisioner is not the       copy       NoProvisionerMatch
              snapshot's driver (or it is unknown)
    snapshot  snapshotted volume's mode is not the        copy       IncompatibleVolumeModes
              target's
    snapshot  restoreSize below the target's size, its    copy       NoVolumeExpansion
              class not expandable
    snapshot  otherwise                                   snapshot   (restored)

And where it runs, by namespace:

    strategy   same namespace                        another namespace
    ---------  ------------------------------------  ---------------------------------------------
    csi-clone  target with dataSource = the source   tmp-pvc-<dv uid> in the source namespace,
                                                     its volume moved (move)
    snapshot   tmp-snapshot-<dv uid> (PVC source),   the same, restored as a temporary claim in the
               target restored from it (snapshot)    source namespace whose volume moves (move)
    copy       target as rendered with an upload server; source pod beside the source (copy); a
               snapshot source is first restored as tmp-source-pvc-<dv uid> (snapshot)

On WaitForFirstConsumer storage a target waits in PendingPopulation; one a move fills waits as
a placeholder claim (``wffc``).

The modules, as CDI splits its clone controller:

- ``source``: source resolution, the PVC source's checks and strategy (CDI's planner);
  ``auth``: the controller's own authorization of a source (requester and access reviews);
- ``move``: the cross-namespace move of a cloned volume (CDI's namespace transfer);
- ``copy``: host-assisted copy (CDI's host clone: upload server and source pod);
- ``snapshot``: smart clone, snapshot sources, VolumeSnapshotClasses (CDI's snapshot clone);
- ``wffc``: WaitForFirstConsumer targets and placeholders;
- ``flavour``: ``CloneFlavour``, the flavour the table names; ``common``: what they share.
"""

from cdi.controller.flavours.clone.flavour import CloneFlavour

__all__ = ["CloneFlavour"]
