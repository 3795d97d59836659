"""Certificates and TLS contexts of the control plane, in one home.

- ``certs``: pure key and certificate generation and the rotation rules (``cryptography``, time
  a parameter): CAs, serving and client certificates, ``plan_rotation``;
- ``store``: a serving certificate rotated in a Secret (``CertStore``), shared by the admission
  webhook, the upload token API and the upload proxy;
- ``upload``: the upload servers' two CAs, each upload pod's serving certificate and the upload
  proxy's client certificate, all kept by the controller;
- ``contexts``: the ``ssl.SSLContext`` of each server and of the proxy's upstream side.

The workers get their certificates as files from the controller and build their own contexts;
they never import this package (the ``layers`` contract in pyproject.toml).
"""
