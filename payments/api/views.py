"""Public API views: parse with an input serializer, call one service, render.

Every lookup is scoped to the authenticated client's accounts, so another
client's payment or account is simply not found (404), on every path.
"""

from __future__ import annotations

import functools
import uuid

from django.db import transaction
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, UnsupportedMediaType
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger import selectors as ledger_selectors
from scheduler_project.errors import DomainError

from .. import selectors, services
from ..exceptions import IdempotencyClaimLost, InvalidRequest, NotFound
from ..idempotency import (
    idempotency_begin,
    idempotency_complete,
    idempotency_release,
    request_fingerprint,
)
from ..models import Actor
from . import serializers as s
from .auth import InternalRateThrottle, InternalTokenAuthentication, IsInternalCaller
from .schema import BODY_ERRORS, api_operation
from .serializers import StrictSerializer

# Business refusals of scheduling, on top of input validation.
SCHEDULE_ERRORS = {
    404: ["not_found"],
    422: ["insufficient_funds", "account_not_found", "account_not_active"],
}


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
        if not 1 <= len(key) <= 255 or not all(" " <= c <= "~" for c in key):
            # printable ASCII: a NUL (which runserver passes on) cannot be stored
            # in PostgreSQL text, and a key is an opaque token, not prose
            raise InvalidRequest(
                "Idempotency-Key must be 1 to 255 printable ASCII characters.",
                fields={"Idempotency-Key": "1 to 255 printable ASCII characters"},
            )
        if "\x00" in request.path:
            # An id with U+0000 names nothing. Answer before the key is claimed:
            # a stored response quoting it would not fit in jsonb (a 500).
            raise NotFound("Not found.")
        body = _fingerprinted(request)
        fingerprint = request_fingerprint(request.method, request.path, body)
        # Before the parsed-body rule a body sent as Application/JSON, */*, …
        # was fingerprinted as no body: keys stored so (24 h) still replay.
        legacy = None
        if body is not None and not request.content_type.startswith("application/json"):
            legacy = request_fingerprint(request.method, request.path, None)
        claim = idempotency_begin(
            client=request.user, key=key, fingerprint=fingerprint, also=legacy
        )
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
        except IdempotencyClaimLost as exc:
            # Still running when a retry took the claim over (IDEMPOTENCY_IN_FLIGHT_TIMEOUT):
            # the work just rolled back; the claim, and the answer, are the retry's.
            return view.handle_exception(exc)
        except UnsupportedMediaType:
            # The body was never read, so nothing ran: the corrected request
            # (sent as JSON) may use the same key.
            idempotency_release(record=claim.record)
            raise
        except (DomainError, APIException) as exc:
            response = view.handle_exception(exc)
            if response.status_code >= 500:  # a bug, not a refusal: free the key
                idempotency_release(record=claim.record)
                return response
            try:
                with transaction.atomic():
                    idempotency_complete(
                        record=claim.record, status=response.status_code, body=response.data
                    )
            except IdempotencyClaimLost as lost:
                return view.handle_exception(lost)
            return response
        except BaseException:
            idempotency_release(record=claim.record)
            raise

    return wrapper


def _fingerprinted(request):
    """The body an Idempotency-Key's fingerprint covers: what the parser made of
    it, whatever the spelling of its media type (``Application/JSON``, ``*/*``:
    the parser takes them; checking the raw header for ``application/json``
    left such bodies out of the fingerprint, so the same key with another
    amount replayed the first answer). None where nothing was parsed — no body,
    or a media type no parser takes (the handler answers 415) — as before."""
    try:
        data = request.data
    except UnsupportedMediaType:
        return None
    if not data and not request.content_type.startswith("application/json"):
        return None  # no body: fingerprinted as before this rule, keys in flight keep theirs
    return data


def parse(serializer_class, data):
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def parse_query(serializer_class, request):
    """The query string's parameters, validated. One given empty (``?status=&limit=``,
    as an HTML form or a URL template sends it) is the same as one left out; a
    parameter given twice counts with its last value (Django's ``QueryDict``)."""
    given = {k: v for k, v in request.query_params.dict().items() if v != ""}
    return parse(serializer_class, given)


def parse_uuid(raw: str, label: str, **details: object) -> uuid.UUID:
    """An id from the URL; one that is not a UUID is a 404 like an unknown one."""
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFound(f"{label} {raw} not found.", **details) from None


def parse_payment_id(raw: str) -> uuid.UUID:
    return parse_uuid(raw, "Payment", payment_id=raw)


class PaymentScheduleView(APIView):
    @api_operation(
        operation_id="payments_schedule",
        summary="Schedule a payment",
        request=s.ScheduleInput,
        idempotent=True,
        responses={201: s.PaymentOutput},
        errors=SCHEDULE_ERRORS,
    )
    @idempotent
    def post(self, request):
        data = parse(s.ScheduleInput, request.data)
        payment = services.payment_schedule(client=request.user, **data)
        return Response(s.payment_data(payment), status=status.HTTP_201_CREATED)


class PaymentCollectionView(PaymentScheduleView):
    @api_operation(
        operation_id="payments_list",
        summary="List payments, newest first",
        parameters=[s.ListQuery],
        responses={200: s.PaymentListOutput},
        errors={400: ["validation_error"]},
    )
    def get(self, request):
        query = parse_query(s.ListQuery, request)
        payments, next_cursor = selectors.payment_list(client=request.user, **query)
        return Response(
            {"payments": [s.payment_data(p) for p in payments], "next_cursor": next_cursor}
        )

    @api_operation(
        operation_id="payments_create",
        summary="Schedule a payment (same as /payments/schedule)",
        request=s.ScheduleInput,
        idempotent=True,
        responses={201: s.PaymentOutput},
        errors=SCHEDULE_ERRORS,
    )
    def post(self, request):
        return super().post(request)


class PaymentDetailView(APIView):
    @api_operation(
        operation_id="payments_retrieve",
        summary="Get a payment",
        responses={200: s.PaymentOutput},
        errors={404: ["not_found"]},
    )
    def get(self, request, payment_id):
        payment = selectors.payment_get(
            client=request.user, payment_id=parse_payment_id(payment_id)
        )
        return Response(s.payment_data(payment))

    @api_operation(
        operation_id="payments_update",
        summary="Reschedule, change amount or description before execution",
        request=s.UpdateInput,
        idempotent=True,
        responses={200: s.PaymentOutput},
        errors={
            404: ["not_found"],
            409: ["payment_not_modifiable"],
            # a changed amount places a new hold: a frozen source refuses it
            422: ["insufficient_funds", "account_not_active"],
        },
    )
    @idempotent
    def patch(self, request, payment_id):
        pid = parse_payment_id(payment_id)
        selectors.payment_get(client=request.user, payment_id=pid)  # 404 before validation
        data = parse(s.UpdateInput, request.data)
        payment = services.payment_update(
            payment_id=pid, client=request.user, actor_user=request.user, **data
        )
        return Response(s.payment_data(payment))


CANCEL_ERRORS = {404: ["not_found"], 409: ["payment_not_cancellable"]}


class PaymentCancelView(APIView):
    def _cancel(self, request, payment_id):
        pid = parse_payment_id(payment_id)
        selectors.payment_get(client=request.user, payment_id=pid)
        body = request.data  # no body (an empty form or no content) or JSON null: no reason
        data = parse(s.CancelInput, {} if body is None or body == {} else body)
        payment = services.payment_cancel(
            payment_id=pid,
            client=request.user,
            actor=Actor.CLIENT,
            actor_user=request.user,
            reason=data["reason"],
        )
        return Response(
            {"success": True, "status": payment.status, "payment": s.payment_data(payment)}
        )

    @api_operation(
        operation_id="payments_cancel_delete",
        summary="Cancel a payment",
        description='A body is optional and read as POST\'s (`{"reason": …}`), so a '
        "malformed, too large or non-JSON one is refused as there (400, 413, 415).",
        idempotent=True,
        responses={200: s.CancelOutput},
        errors={**CANCEL_ERRORS, **BODY_ERRORS},
    )
    @idempotent
    def delete(self, request, payment_id):
        return self._cancel(request, payment_id)

    @api_operation(
        operation_id="payments_cancel",
        summary="Cancel a payment (optionally with a reason)",
        request=s.CancelInput,
        idempotent=True,
        responses={200: s.CancelOutput},
        errors=CANCEL_ERRORS,
    )
    @idempotent
    def post(self, request, payment_id):
        return self._cancel(request, payment_id)


class PaymentEventsView(APIView):
    @api_operation(
        operation_id="payments_events",
        summary="Audit trail of a payment, oldest first",
        parameters=[s.LogQuery],
        responses={200: s.EventListOutput},
        errors={400: ["validation_error"], 404: ["not_found"]},
    )
    def get(self, request, payment_id):
        query = parse_query(s.LogQuery, request)
        payment = selectors.payment_get(
            client=request.user, payment_id=parse_payment_id(payment_id)
        )
        # a page at a time: every PATCH adds an event, so a payment's trail has
        # no bound of its own (one response of all of it held a web thread and
        # memory in proportion: a review, session 42)
        events, next_cursor = selectors.id_page(
            payment.events.all(),
            cursor=query.get("cursor"),
            limit=query["limit"],
            oldest_first=True,
        )
        return Response(
            {"events": s.EventOutput(events, many=True).data, "next_cursor": next_cursor}
        )


class PaymentAttemptsView(APIView):
    @api_operation(
        operation_id="payments_attempts",
        summary="Execution attempts of a payment",
        responses={200: s.AttemptListOutput},
        errors={404: ["not_found"]},
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
    @api_operation(
        operation_id="accounts_list", summary="Your accounts", responses={200: s.AccountListOutput}
    )
    def get(self, request):
        accounts = ledger_selectors.account_list_for_owner(owner=request.user)
        return Response({"accounts": s.AccountOutput(accounts, many=True).data})


class AccountDetailView(APIView):
    @api_operation(
        operation_id="accounts_retrieve",
        summary="An account: balance, held, available, max_payment_amount",
        responses={200: s.AccountOutput},
        errors={404: ["not_found"]},
    )
    def get(self, request, account_id: int):
        return Response(s.AccountOutput(owned_account(request, account_id)).data)


class AccountTransactionsView(APIView):
    @api_operation(
        operation_id="accounts_transactions",
        summary="Ledger statement with running balance, newest first",
        parameters=[s.StatementQuery],
        responses={200: s.StatementOutput},
        errors={400: ["validation_error"], 404: ["not_found"]},
    )
    def get(self, request, account_id: int):
        account = owned_account(request, account_id)
        query = parse_query(s.StatementQuery, request)
        before = None
        if query.get("cursor"):
            before = selectors.decode_id_cursor(query["cursor"])
        limit = query["limit"]
        rows = ledger_selectors.account_statement(
            account_id=account.pk, before_posting_id=before, limit=limit + 1
        )
        rows, next_cursor = selectors.cut_page(rows, limit, lambda row: (row.pk,))
        return Response(
            {
                "account": s.AccountOutput(account).data,
                "transactions": s.StatementLineOutput(rows, many=True).data,
                "next_cursor": next_cursor,
            }
        )


class InternalExecuteInput(StrictSerializer):
    execution_id = serializers.CharField(min_length=1, max_length=100)


class InternalExecuteOutput(s.PaymentOutput):
    execution_id = serializers.CharField(help_text="As sent.")


class InternalExecuteView(APIView):
    """Operator trigger: execute a due payment now. Idempotent: a repeat returns the outcome."""

    authentication_classes = [InternalTokenAuthentication]
    permission_classes = [IsInternalCaller]
    throttle_classes = [InternalRateThrottle]

    def perform_authentication(self, request):
        """Lazy: X-Internal-Auth is checked with the permission, after the throttle."""

    def check_permissions(self, request):
        """Throttle first: a caller guessing X-Internal-Auth is throttled too
        (DRF checks permissions before throttles)."""
        super().check_throttles(request)
        super().check_permissions(request)

    def check_throttles(self, request):
        """Already checked, before the permission (see ``check_permissions``)."""

    @api_operation(
        operation_id="internal_payment_execute",
        summary="Execute a due payment now (operators; X-Internal-Auth)",
        description="Disabled (404) unless INTERNAL_API_TOKEN is set; a missing or wrong "
        "X-Internal-Auth is a 404 too. Repeating it returns the payment's outcome.",
        request=InternalExecuteInput,
        bearer=False,
        responses={200: InternalExecuteOutput},
        errors={404: ["not_found"], 409: ["payment_not_due"]},
    )
    def post(self, request, payment_id):
        data = parse(InternalExecuteInput, request.data)
        payment = services.payment_execute_now(
            payment_id=parse_payment_id(payment_id), execution_id=data["execution_id"]
        )
        return Response({"execution_id": data["execution_id"], **s.payment_data(payment)})
