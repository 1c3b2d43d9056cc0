"""The browser console: function views that parse, call a service and render."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET


@require_GET
@login_required
def inbox(request):
    return render(request, "console/inbox.html", {})
