"""The browser console: function views that parse, call one service and render.

One module per area of the console; ``console_urls.py`` names their views. Every action
is a plain form POST answered with a redirect, so it works without JavaScript; htmx
only refreshes parts of pages (``template#partial``, see ``common.partial``).
"""
