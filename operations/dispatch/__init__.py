"""Calls to the outside world, made outside any transaction: reconciliation probes,
webhook delivery, the mail to approvers, and the guarded transport (``egress``) that
connects only where ``operations.hosts`` allows. What each call finds is recorded
through the services.
"""
