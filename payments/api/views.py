"""Public API views: parse with an input serializer, call one service, render.

Every lookup is scoped to the authenticated client's accounts, so another
client's payment or account is simply not found (404), on every path.
"""

from __future__ import annotations

import functools
import hmac
import uuid

from django.conf import settings
from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger import selectors as ledger_selectors
from ledger.exceptions import LedgerError

from .. import execution, selectors, services
from ..exceptions import InvalidRequest, NotFound
from ..idempotency import (
    idempotency_begin,
    idempotency_complete,
    idempotency_release,
    request_fingerprint,
)
from ..models import Actor
from . import serializers as s
from .auth import InternalRateThrottle
from .serializers import StrictSerializer

IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": 255},
    OpenApiParameter.HEADER,
    description="Retry-safe key (1 to 255 chars), kept 24 h, scoped to the client.",
)
ERROR = OpenApiResponse(
    response=OpenApiTypes.OBJECT, description='{"error": {"code", "message", "details"}}'
)


def idempotent(handler=None, *, stored_body=None):
    """Apply Idempotency-Key semantics (``payments.idempotency``) to a write handler.

    The handler's writes and the stored response commit in one transaction.
    Business-rule refusals (4xx) are stored and replayed like successes;
    an unexpected error releases the key so the client can retry.

    ``stored_body(data) -> data``, if given, makes the body that is stored (and
    so replayed) from the handler's response body; the live response is sent
    unchanged. For what may be shown once only, e.g. a secret:
    ``@idempotent(stored_body=without_secret)``.
    """
    if handler is None:
        return functools.partial(idempotent, stored_body=stored_body)

    @functools.wraps(handler)
    def wrapper(view, request, *args, **kwargs):
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return handler(view, request, *args, **kwargs)
        if not 1 <= len(key) <= 255:
            raise InvalidRequest(
                "Idempotency-Key must be 1 to 255 characters.",
                fields={"Idempotency-Key": "1 to 255 characters"},
            )
        if "\x00" in request.path:
            # An id with U+0000 names nothing. Answer before the key is claimed:
            # a stored response quoting it would not fit in jsonb (a 500).
            raise NotFound("Not found.")
        body = request.data if request.content_type.startswith("application/json") else None
        fingerprint = request_fingerprint(request.method, request.path, body)
        claim = idempotency_begin(client=request.user, key=key, fingerprint=fingerprint)
        if claim.replay:
            return Response(
                claim.record.response_body,
                status=claim.record.response_status,
                headers={"Idempotent-Replayed": "true"},
            )
        try:
            with transaction.atomic():
                response = handler(view, request, *args, **kwargs)
                body = response.data if stored_body is None else stored_body(response.data)
                idempotency_complete(record=claim.record, status=response.status_code, body=body)
            return response
        except (LedgerError, APIException) as exc:
            response = view.handle_exception(exc)
            with transaction.atomic():
                idempotency_complete(
                    record=claim.record, status=response.status_code, body=response.data
                )
            return response
        except BaseException:
            idempotency_release(record=claim.record)
            raise

    return wrapper


def parse(serializer_class, data):
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def parse_payment_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFound(f"Payment {raw} not found.", payment_id=raw) from None


class PaymentScheduleView(APIView):
    @extend_schema(
        operation_id="payments_schedule",
        summary="Schedule a payment",
        request=s.ScheduleInput,
        parameters=[IDEMPOTENCY_HEADER],
        responses={201: s.PaymentOutput, 400: ERROR, 404: ERROR, 409: ERROR, 422: ERROR},
    )
    @idempotent
    def post(self, request):
        data = parse(s.ScheduleInput, request.data)
        payment = services.payment_schedule(client=request.user, **data)
        return Response(s.PaymentOutput(payment).data, status=status.HTTP_201_CREATED)


class PaymentCollectionView(PaymentScheduleView):
    @extend_schema(
        operation_id="payments_list",
        summary="List payments, newest first",
        parameters=[s.ListQuery],
        responses={200: s.PaymentListOutput, 400: ERROR},
    )
    def get(self, request):
        query = parse(s.ListQuery, request.query_params.dict())
        payments, next_cursor = selectors.payment_list(client=request.user, **query)
        return Response(
            {"payments": s.PaymentOutput(payments, many=True).data, "next_cursor": next_cursor}
        )

    @extend_schema(
        operation_id="payments_create",
        summary="Schedule a payment (same as /payments/schedule)",
        request=s.ScheduleInput,
        parameters=[IDEMPOTENCY_HEADER],
        responses={201: s.PaymentOutput, 400: ERROR, 404: ERROR, 409: ERROR, 422: ERROR},
    )
    def post(self, request):
        return super().post(request)


class PaymentDetailView(APIView):
    @extend_schema(summary="Get a payment", responses={200: s.PaymentOutput, 404: ERROR})
    def get(self, request, payment_id):
        payment = selectors.payment_get(
            client=request.user, payment_id=parse_payment_id(payment_id)
        )
        return Response(s.PaymentOutput(payment).data)

    @extend_schema(
        summary="Reschedule, change amount or description before execution",
        request=s.UpdateInput,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.PaymentOutput, 400: ERROR, 404: ERROR, 409: ERROR, 422: ERROR},
    )
    @idempotent
    def patch(self, request, payment_id):
        pid = parse_payment_id(payment_id)
        selectors.payment_get(client=request.user, payment_id=pid)  # 404 before validation
        data = parse(s.UpdateInput, request.data)
        payment = services.payment_update(
            payment_id=pid, client=request.user, actor_user=request.user, **data
        )
        return Response(s.PaymentOutput(payment).data)


class PaymentCancelView(APIView):
    def _cancel(self, request, payment_id):
        pid = parse_payment_id(payment_id)
        selectors.payment_get(client=request.user, payment_id=pid)
        data = parse(s.CancelInput, request.data or {})
        payment = services.payment_cancel(
            payment_id=pid,
            client=request.user,
            actor=Actor.CLIENT,
            actor_user=request.user,
            reason=data["reason"],
        )
        return Response(
            {"success": True, "status": payment.status, "payment": s.PaymentOutput(payment).data}
        )

    @extend_schema(
        operation_id="payments_cancel_delete",
        summary="Cancel a payment",
        request=None,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.CancelOutput, 404: ERROR, 409: ERROR},
    )
    @idempotent
    def delete(self, request, payment_id):
        return self._cancel(request, payment_id)

    @extend_schema(
        operation_id="payments_cancel",
        summary="Cancel a payment",
        request=s.CancelInput,
        parameters=[IDEMPOTENCY_HEADER],
        responses={200: s.CancelOutput, 404: ERROR, 409: ERROR},
    )
    @idempotent
    def post(self, request, payment_id):
        return self._cancel(request, payment_id)


class PaymentEventsView(APIView):
    @extend_schema(
        summary="Audit trail of a payment", responses={200: s.EventListOutput, 404: ERROR}
    )
    def get(self, request, payment_id):
        payment = selectors.payment_get(
            client=request.user, payment_id=parse_payment_id(payment_id)
        )
        events = payment.events.order_by("pk")
        return Response({"events": s.EventOutput(events, many=True).data})


class PaymentAttemptsView(APIView):
    @extend_schema(
        summary="Execution attempts of a payment", responses={200: s.AttemptListOutput, 404: ERROR}
    )
    def get(self, request, payment_id):
        payment = selectors.payment_get(
            client=request.user, payment_id=parse_payment_id(payment_id)
        )
        attempts = payment.attempt_log.order_by("pk")
        return Response({"attempts": s.AttemptOutput(attempts, many=True).data})


def owned_account(request, account_id: int):
    account = ledger_selectors.account_get_for_owner(owner=request.user, account_id=account_id)
    if account is None:
        raise NotFound(f"Account {account_id} not found.", account_id=account_id)
    return account


class AccountListView(APIView):
    @extend_schema(
        operation_id="accounts_list", summary="Your accounts", responses={200: s.AccountListOutput}
    )
    def get(self, request):
        accounts = ledger_selectors.account_list_for_owner(owner=request.user)
        return Response({"accounts": s.AccountOutput(accounts, many=True).data})


class AccountDetailView(APIView):
    @extend_schema(
        summary="An account: balance, held, available", responses={200: s.AccountOutput, 404: ERROR}
    )
    def get(self, request, account_id: int):
        return Response(s.AccountOutput(owned_account(request, account_id)).data)


class AccountTransactionsView(APIView):
    @extend_schema(
        summary="Ledger statement with running balance, newest first",
        parameters=[s.StatementQuery],
        responses={200: s.StatementOutput, 400: ERROR, 404: ERROR},
    )
    def get(self, request, account_id: int):
        account = owned_account(request, account_id)
        query = parse(s.StatementQuery, request.query_params.dict())
        before = None
        if query.get("cursor"):
            before = selectors.decode_id_cursor(query["cursor"])
        limit = query["limit"]
        rows = ledger_selectors.account_statement(
            account_id=account.pk, before_posting_id=before, limit=limit + 1
        )
        next_cursor = selectors.encode_cursor(rows[limit - 1].pk) if len(rows) > limit else None
        return Response(
            {
                "account": s.AccountOutput(account).data,
                "transactions": s.StatementLineOutput(rows[:limit], many=True).data,
                "next_cursor": next_cursor,
            }
        )


class InternalExecuteInput(StrictSerializer):
    execution_id = serializers.CharField(min_length=1, max_length=100)


class InternalAuthPermission(BasePermission):
    """``X-Internal-Auth`` must equal ``INTERNAL_API_TOKEN`` (unset: the path is disabled)."""

    def has_permission(self, request, view):
        expected = settings.INTERNAL_API_TOKEN
        given = request.headers.get("X-Internal-Auth", "")
        if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
            raise NotFound("Not found.")
        return True


class InternalExecuteView(APIView):
    """Operator trigger: execute a due payment now. Idempotent: a repeat returns the outcome."""

    authentication_classes: list = []
    permission_classes = [InternalAuthPermission]
    throttle_classes = [InternalRateThrottle]

    def check_permissions(self, request):
        """Throttle first: a caller guessing X-Internal-Auth is throttled too
        (DRF checks permissions before throttles)."""
        super().check_throttles(request)
        super().check_permissions(request)

    def check_throttles(self, request):
        """Already checked, before the permission (see ``check_permissions``)."""

    @extend_schema(
        operation_id="internal_payment_execute",
        summary="Execute a due payment now (operators; X-Internal-Auth)",
        request=InternalExecuteInput,
        parameters=[
            OpenApiParameter(
                "X-Internal-Auth", OpenApiTypes.STR, OpenApiParameter.HEADER, required=True
            )
        ],
        responses={200: s.PaymentOutput, 404: ERROR, 409: ERROR},
    )
    def post(self, request, payment_id):
        data = parse(InternalExecuteInput, request.data)
        payment = execution.payment_execute_now(
            payment_id=parse_payment_id(payment_id), execution_id=data["execution_id"]
        )
        return Response({"execution_id": data["execution_id"], **s.PaymentOutput(payment).data})
