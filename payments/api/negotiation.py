"""Content negotiation for an API that answers JSON only.

DRF's default answers ``?format=xml`` (a format no renderer has) with a 404
and an ``Accept`` it cannot meet with a 406 — statuses no operation of the
schema declares, for requests whose only fault is asking for a representation
the API does not have. Here both are disregarded and the view's first
renderer answers (JSON; the schema view's default for ``/api/schema/``), as
RFC 9110 §12.5.1 allows a server to do.
"""

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation


class FirstRendererIfUnmet(DefaultContentNegotiation):
    def filter_renderers(self, renderers, format):
        """The renderers of ``?format=``'s format, or all of them when none has it."""
        return [renderer for renderer in renderers if renderer.format == format] or renderers

    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except NotAcceptable:
            return renderers[0], renderers[0].media_type
