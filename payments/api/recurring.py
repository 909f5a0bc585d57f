"""API for recurring payments and webhook endpoints: same auth, isolation,
idempotency and error shape as payments."""

from __future__ import annotations

import uuid

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import recurring, webhooks
from ..exceptions import NotFound
from ..models import RecurringOccurrence, RecurringPayment
from ..selectors import decode_id_cursor, encode_cursor, newest_first_page
from . import serializers as s
from .views import ERROR, IDEMPOTENCY_HEADER, idempotent, parse


def parse_uuid(raw: str, label: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFound(f"{label} {raw} not found.") from None


def _flatten(data: dict) -> dict:
    policy = data.pop("dst_policy", None)
    if policy is not None:
        data["dst_nonexistent"] = policy["nonexistent"]
        data["dst_ambiguous"] = policy["ambiguous"]
    return data


def _owned(request, raw_id) -> RecurringPayment:
    schedule = RecurringPayment.objects.filter(
        from_account__owner=request.user, pk=parse_uuid(raw_id, "Recurring payment")
    ).first()
    if schedule is None:
        raise NotFound(f"Recurring payment {raw_id} not found.")
    return schedule


def _page(qs, cursor: str | None, limit: int):
    if cursor:
        qs = qs.filter(pk__lt=decode_id_cursor(cursor))
    rows = list(qs.order_by("-pk")[: limit + 1])
    return rows[:limit], (encode_cursor(rows[limit - 1].pk) if len(rows) > limit else None)


class RecurringCollectionView(APIView):
    @extend_schema(
        operation_id="recurring_list",
        summary="List recurring payments",
        parameters=[s.RecurringListQuery],
        responses={200: s.RecurringListOutput, 400: ERROR},
    )
    def get(self, request):
        query = parse(s.RecurringListQuery, request.query_params.dict())
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

    @extend_schema(
        operation_id="recurring_create",
        summary="Create a recurring payment (cron or interval, in a time zone)",
        request=s.RecurringInput,
        parameters=[IDEMPOTENCY_HEADER],
        responses={201: s.RecurringOutput, 400: ERROR, 404: ERROR, 409: ERROR, 422: ERROR},
    )
    @idempotent
    def post(self, request):
        data = _flatten(dict(parse(s.RecurringInput, request.data)))
        schedule = recurring.recurring_create(client=request.user, **data)
        return Response(s.RecurringOutput(schedule).data, status=status.HTTP_201_CREATED)


class RecurringDetailView(APIView):
    @extend_schema(
        summary="Get a recurring payment", responses={200: s.RecurringOutput, 404: ERROR}
    )
    def get(self, request, recurring_id):
        return Response(s.RecurringOutput(_owned(request, recurring_id)).data)

    @extend_schema(
        summary="Change a recurring payment",
        request=s.RecurringUpdateInput,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.RecurringOutput, 400: ERROR, 404: ERROR, 409: ERROR},
    )
    @idempotent
    def patch(self, request, recurring_id):
        schedule = _owned(request, recurring_id)
        data = _flatten(dict(parse(s.RecurringUpdateInput, request.data)))
        schedule = recurring.recurring_update(schedule_id=schedule.pk, client=request.user, **data)
        return Response(s.RecurringOutput(schedule).data)


class RecurringActionView(APIView):
    action_name = ""

    @extend_schema(
        request=None,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.RecurringOutput, 404: ERROR, 409: ERROR},
    )
    @idempotent
    def post(self, request, recurring_id):
        schedule = _owned(request, recurring_id)
        schedule = recurring.recurring_set_status(
            schedule_id=schedule.pk, client=request.user, action=self.action_name
        )
        return Response(s.RecurringOutput(schedule).data)


class RecurringOccurrencesView(APIView):
    @extend_schema(
        summary="Occurrences of a recurring payment (newest first) and the next planned ones",
        parameters=[s.StatementQuery],
        responses={200: s.OccurrenceListOutput, 400: ERROR, 404: ERROR},
    )
    def get(self, request, recurring_id):
        schedule = _owned(request, recurring_id)
        query = parse(s.StatementQuery, request.query_params.dict())
        rows, next_cursor = _page(
            RecurringOccurrence.objects.filter(recurring=schedule).select_related("payment"),
            query.get("cursor"),
            query["limit"],
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


class WebhookEndpointCollectionView(APIView):
    @extend_schema(
        operation_id="webhook_endpoints_list",
        summary="Your webhook endpoints",
        responses={200: s.WebhookEndpointListOutput},
    )
    def get(self, request):
        endpoints = request.user.webhook_endpoints.order_by("created_at")
        return Response({"webhook_endpoints": s.WebhookEndpointOutput(endpoints, many=True).data})

    @extend_schema(
        operation_id="webhook_endpoints_create",
        summary="Register a webhook endpoint; the signing secret is returned once",
        description="The URL must be https and reach a public internet address; a "
        "replay of this response for the same Idempotency-Key has `secret: null` and "
        "`secret_shown_once: true`. At most WEBHOOK_MAX_ENDPOINTS_PER_CLIENT endpoints "
        "per client (422 limit_exceeded).",
        request=s.WebhookEndpointInput,
        parameters=[IDEMPOTENCY_HEADER],
        responses={201: s.WebhookEndpointCreatedOutput, 400: ERROR, 422: ERROR},
    )
    @idempotent(stored_body=without_secret)
    def post(self, request):
        data = parse(s.WebhookEndpointInput, request.data)
        endpoint = webhooks.endpoint_create(client=request.user, **data)
        return Response(
            s.WebhookEndpointCreatedOutput(endpoint).data, status=status.HTTP_201_CREATED
        )


class WebhookEndpointDetailView(APIView):
    def _get(self, request, endpoint_id):
        return webhooks.endpoint_get(
            client=request.user, endpoint_id=parse_uuid(endpoint_id, "Webhook endpoint")
        )

    @extend_schema(
        summary="A webhook endpoint", responses={200: s.WebhookEndpointOutput, 404: ERROR}
    )
    def get(self, request, endpoint_id):
        return Response(s.WebhookEndpointOutput(self._get(request, endpoint_id)).data)

    @extend_schema(
        summary="Change a webhook endpoint",
        request=s.WebhookEndpointUpdateInput,
        responses={200: s.WebhookEndpointOutput, 400: ERROR, 404: ERROR},
    )
    def patch(self, request, endpoint_id):
        endpoint = self._get(request, endpoint_id)
        data = parse(s.WebhookEndpointUpdateInput, request.data)
        endpoint = webhooks.endpoint_update(client=request.user, endpoint_id=endpoint.pk, **data)
        return Response(s.WebhookEndpointOutput(endpoint).data)

    @extend_schema(summary="Delete a webhook endpoint", responses={204: None, 404: ERROR})
    def delete(self, request, endpoint_id):
        endpoint = self._get(request, endpoint_id)
        webhooks.endpoint_delete(client=request.user, endpoint_id=endpoint.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookDeliveriesView(APIView):
    @extend_schema(
        summary="Delivery log of a webhook endpoint, newest first",
        responses={200: s.WebhookDeliveryListOutput, 404: ERROR},
    )
    def get(self, request, endpoint_id):
        endpoint = webhooks.endpoint_get(
            client=request.user, endpoint_id=parse_uuid(endpoint_id, "Webhook endpoint")
        )
        deliveries = endpoint.deliveries.order_by("-created_at")[:100]
        return Response({"deliveries": s.WebhookDeliveryOutput(deliveries, many=True).data})
