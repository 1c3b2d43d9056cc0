"""Console pages beyond the approvals and reconciliation views of ``console.views``.

One module per page family; each holds function views that parse the request, call
selectors (or one service for a POST) and render. ``console_urls.py`` names them.
"""
