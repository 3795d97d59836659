"""Admission webhooks for DataVolumes.

The rules are pure functions (``validation``, ``mutation``) over decoded objects and an injected
read-only view of the cluster; the HTTP server that feeds them AdmissionReviews is a thin shell
around them.
"""
