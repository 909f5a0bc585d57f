"""API for recurring payments and webhook endpoints: same auth, isolation,
idempotency and error shape as payments."""

from __future__ import annotations

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import services, webhooks
from ..exceptions import NotFound
from ..models import RecurringOccurrence, RecurringPayment
from ..selectors import id_page, newest_first_page
from . import serializers as s
from .auth import OneAtATime, WebhookEndpointWriteThrottle
from .schema import api_operation
from .views import idempotent, parse, parse_query, parse_uuid


def _flatten(data: dict) -> dict:
    policy = data.pop("dst_policy", None) or {}
    for key in ("nonexistent", "ambiguous"):  # a PATCH carries only the keys it changes
        if key in policy:
            data[f"dst_{key}"] = policy[key]
    return data


def _owned(request, raw_id) -> RecurringPayment:
    schedule = RecurringPayment.objects.filter(
        from_account__owner=request.user, pk=parse_uuid(raw_id, "Recurring payment")
    ).first()
    if schedule is None:
        raise NotFound(f"Recurring payment {raw_id} not found.")
    return schedule


class RecurringCollectionView(APIView):
    @api_operation(
        operation_id="recurring_list",
        summary="List recurring payments",
        parameters=[s.RecurringListQuery],
        responses={200: s.RecurringListOutput},
        errors={400: ["validation_error"]},
    )
    def get(self, request):
        query = parse_query(s.RecurringListQuery, request)
        qs = RecurringPayment.objects.filter(from_account__owner=request.user)
        if query.get("status"):
            qs = qs.filter(status=query["status"])
        page, next_cursor = newest_first_page(qs, cursor=query.get("cursor"), limit=query["limit"])
        return Response(
            {
                "recurring_payments": s.RecurringOutput(page, many=True).data,
                "next_cursor": next_cursor,
            }
        )

    @api_operation(
        operation_id="recurring_create",
        summary="Create a recurring payment (cron or interval, in a time zone)",
        request=s.RecurringInput,
        idempotent=True,
        responses={201: s.RecurringOutput},
        errors={
            404: ["not_found"],
            422: ["limit_exceeded", "account_not_found", "account_not_active"],
        },
    )
    @idempotent
    def post(self, request):
        data = _flatten(dict(parse(s.RecurringInput, request.data)))
        schedule = services.recurring_create(client=request.user, **data)
        return Response(s.RecurringOutput(schedule).data, status=status.HTTP_201_CREATED)


class RecurringDetailView(APIView):
    @api_operation(
        operation_id="recurring_retrieve",
        summary="Get a recurring payment",
        responses={200: s.RecurringOutput},
        errors={404: ["not_found"]},
    )
    def get(self, request, recurring_id):
        return Response(s.RecurringOutput(_owned(request, recurring_id)).data)

    @api_operation(
        operation_id="recurring_update",
        summary="Change a recurring payment",
        request=s.RecurringUpdateInput,
        idempotent=True,
        responses={200: s.RecurringOutput},
        errors={404: ["not_found"], 409: ["recurring_not_modifiable"]},
    )
    @idempotent
    def patch(self, request, recurring_id):
        schedule = _owned(request, recurring_id)
        data = _flatten(dict(parse(s.RecurringUpdateInput, request.data)))
        schedule = services.recurring_update(schedule_id=schedule.pk, client=request.user, **data)
        return Response(s.RecurringOutput(schedule).data)


class RecurringActionView(APIView):
    """pause / resume / cancel: one transition of the schedule's status."""

    action_name = ""

    @idempotent
    def post(self, request, recurring_id):
        schedule = _owned(request, recurring_id)
        schedule = services.recurring_set_status(
            schedule_id=schedule.pk, client=request.user, action=self.action_name
        )
        return Response(s.RecurringOutput(schedule).data)


def _action_operation(action: str, summary: str):
    return api_operation(
        operation_id=f"recurring_{action}",
        summary=summary,
        idempotent=True,
        responses={200: s.RecurringOutput},
        errors={404: ["not_found"], 409: ["recurring_not_modifiable"]},
    )


class RecurringPauseView(RecurringActionView):
    action_name = "pause"

    @_action_operation("pause", "Pause a recurring payment (no occurrence runs while paused)")
    def post(self, request, recurring_id):
        return super().post(request, recurring_id)


class RecurringResumeView(RecurringActionView):
    action_name = "resume"

    @_action_operation("resume", "Resume a paused recurring payment")
    def post(self, request, recurring_id):
        return super().post(request, recurring_id)


class RecurringCancelView(RecurringActionView):
    action_name = "cancel"

    @_action_operation("cancel", "Cancel a recurring payment and its occurrence already scheduled")
    def post(self, request, recurring_id):
        return super().post(request, recurring_id)


class RecurringOccurrencesView(APIView):
    @api_operation(
        operation_id="recurring_occurrences",
        summary="Occurrences of a recurring payment (newest first) and the next planned ones",
        parameters=[s.StatementQuery],
        responses={200: s.OccurrenceListOutput},
        errors={400: ["validation_error"], 404: ["not_found"]},
    )
    def get(self, request, recurring_id):
        schedule = _owned(request, recurring_id)
        query = parse_query(s.StatementQuery, request)
        rows, next_cursor = id_page(
            RecurringOccurrence.objects.filter(recurring=schedule).select_related("payment"),
            cursor=query.get("cursor"),
            limit=query["limit"],
        )
        return Response(
            {
                "next_run_at": s.RecurringOutput(schedule).data["next_run_at"],
                "upcoming": s.RecurringOutput().get_upcoming(schedule),
                "occurrences": s.OccurrenceOutput(rows, many=True).data,
                "next_cursor": next_cursor,
            }
        )


def without_secret(body: dict) -> dict:
    """The created-endpoint body as kept for Idempotency-Key replays: no secret."""
    return {**body, "secret": None, "secret_shown_once": True}


ENDPOINT_WRITES = ("POST", "PATCH", "PUT")
# One endpoint write of a client at a time (each may wait on DNS, see below).
_endpoint_write_slot = OneAtATime("webhook-endpoint-write", seconds=60)


class WebhookEndpointWrites:
    """POST and PATCH also spend the client's ``WebhookEndpointWriteThrottle`` budget,
    and run one at a time per client: each looks its host up inside the request
    (up to ``WEBHOOK_REGISTRATION_DNS_SECONDS``), holding a web thread, so a
    client's writes sent in parallel would take the web threads from everyone
    else. The second one meanwhile gets 429 ``throttled`` (Retry-After)."""

    _slot: str | None = None

    def get_throttles(self):
        throttles = super().get_throttles()
        if self.request.method in ENDPOINT_WRITES:
            throttles.append(WebhookEndpointWriteThrottle())
        return throttles

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)  # authenticated, throttles spent
        if request.method in ENDPOINT_WRITES:
            self._slot = _endpoint_write_slot.acquire(request.user.pk)
            if self._slot is None:
                raise exceptions.Throttled(
                    wait=settings.WEBHOOK_REGISTRATION_DNS_SECONDS,
                    detail="Another change to your webhook endpoints is in progress; "
                    "retry when it has finished.",
                )

    def _release(self) -> None:
        if self._slot is not None:
            slot, self._slot = self._slot, None
            _endpoint_write_slot.release(self.request.user.pk, slot)

    def handle_exception(self, exc):
        try:
            return super().handle_exception(exc)
        finally:  # an exception DRF does not turn into a response is re-raised
            self._release()

    def finalize_response(self, request, response, *args, **kwargs):
        self._release()
        return super().finalize_response(request, response, *args, **kwargs)


class WebhookEndpointCollectionView(WebhookEndpointWrites, APIView):
    @api_operation(
        operation_id="webhook_endpoints_list",
        summary="Your webhook endpoints",
        responses={200: s.WebhookEndpointListOutput},
    )
    def get(self, request):
        endpoints = request.user.webhook_endpoints.order_by("created_at")
        return Response({"webhook_endpoints": s.WebhookEndpointOutput(endpoints, many=True).data})

    @api_operation(
        operation_id="webhook_endpoints_create",
        summary="Register a webhook endpoint; the signing secret is returned once",
        description="The URL must be https and reach a public internet address; a "
        "replay of this response for the same Idempotency-Key has `secret: null` and "
        "`secret_shown_once: true`. At most WEBHOOK_MAX_ENDPOINTS_PER_CLIENT endpoints "
        "per client (422 limit_exceeded).",
        request=s.WebhookEndpointInput,
        idempotent=True,
        responses={201: s.WebhookEndpointCreatedOutput},
        errors={422: ["limit_exceeded"]},
    )
    @idempotent(stored_body=without_secret)
    def post(self, request):
        data = parse(s.WebhookEndpointInput, request.data)
        endpoint = webhooks.endpoint_create(client=request.user, **data)
        return Response(
            s.WebhookEndpointCreatedOutput(endpoint).data, status=status.HTTP_201_CREATED
        )


class WebhookEndpointDetailView(WebhookEndpointWrites, APIView):
    def _get(self, request, endpoint_id):
        return webhooks.endpoint_get(
            client=request.user, endpoint_id=parse_uuid(endpoint_id, "Webhook endpoint")
        )

    @api_operation(
        operation_id="webhook_endpoints_retrieve",
        summary="A webhook endpoint",
        responses={200: s.WebhookEndpointOutput},
        errors={404: ["not_found"]},
    )
    def get(self, request, endpoint_id):
        return Response(s.WebhookEndpointOutput(self._get(request, endpoint_id)).data)

    @api_operation(
        operation_id="webhook_endpoints_update",
        summary="Change a webhook endpoint",
        request=s.WebhookEndpointUpdateInput,
        responses={200: s.WebhookEndpointOutput},
        errors={404: ["not_found"]},
    )
    def patch(self, request, endpoint_id):
        endpoint = self._get(request, endpoint_id)
        data = parse(s.WebhookEndpointUpdateInput, request.data)
        endpoint = webhooks.endpoint_update(client=request.user, endpoint_id=endpoint.pk, **data)
        return Response(s.WebhookEndpointOutput(endpoint).data)

    @api_operation(
        operation_id="webhook_endpoints_delete",
        summary="Delete a webhook endpoint",
        responses={204: None},
        errors={404: ["not_found"]},
    )
    def delete(self, request, endpoint_id):
        endpoint = self._get(request, endpoint_id)
        webhooks.endpoint_delete(client=request.user, endpoint_id=endpoint.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookDeliveriesView(APIView):
    @api_operation(
        operation_id="webhook_endpoints_deliveries",
        summary="Delivery log of a webhook endpoint, newest first",
        parameters=[s.LogQuery],
        responses={200: s.WebhookDeliveryListOutput},
        errors={400: ["validation_error"], 404: ["not_found"]},
    )
    def get(self, request, endpoint_id):
        query = parse_query(s.LogQuery, request)
        endpoint = webhooks.endpoint_get(
            client=request.user, endpoint_id=parse_uuid(endpoint_id, "Webhook endpoint")
        )
        # a page at a time on (endpoint, created_at DESC, id DESC): it sorted
        # every delivery of the endpoint for the newest 100, and showed no more
        deliveries, next_cursor = newest_first_page(
            endpoint.deliveries.all(), cursor=query.get("cursor"), limit=query["limit"]
        )
        return Response(
            {
                "deliveries": s.WebhookDeliveryOutput(deliveries, many=True).data,
                "next_cursor": next_cursor,
            }
        )
