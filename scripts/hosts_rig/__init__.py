"""The pieces behind scripts/torchrun_hosts.py, the launcher and its command line; one idea a module.

- ``processes``: finding and stopping processes (a process tree, a namespace's, a dead owner's leftovers).
- ``guards``: the signal handling that lets a rig's teardown run on every exit path.
- ``netns``: network namespaces of a run (names, ``ip``, the probe, stale-run reaping, /etc/hosts).
- ``shaping``: tc's token-bucket filter that caps a link's rate.
- ``launch``: torchrun on each host, waited for together (one host, or a rig's hosts).
- ``two_hosts``: two namespaces joined by a veth pair (:class:`TwoHosts`).
- ``mounts``: FUSE mounts (listing, unmounting, deleting a directory never through a mount).
- ``storage_tools``: what the storage rig needs installed, and installing it.
- ``storage``: hosts reading one directory over sshfs from a storage namespace (:class:`StorageHosts`).
"""
