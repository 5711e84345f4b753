"""The README's walkthrough through a Python client generated from payonce's OpenAPI
document by openapi-python-client, without edits: python walkthrough.py BASE_URL.

Run by scripts/clients.sh; exits non-zero (an AssertionError) on any answer the walkthrough
does not expect."""

import sys
import uuid

from payonce_client import AuthenticatedClient, Client
from payonce_client.api.accounts import create_account, get_account
from payonce_client.api.holds import capture_hold, get_hold, place_hold, refund_hold
from payonce_client.api.orders import create_order, get_order, pay_order, refund_order
from payonce_client.api.spends import draw, withdraw
from payonce_client.api.tickets import get_ticket, issue_ticket
from payonce_client.models import (
    CaptureRequest,
    DrawRequest,
    HoldRequest,
    MoneyMoved,
    MoneyRequest,
    NewAccountRequest,
    OrderRequest,
    PaymentRequest,
    Problem,
    RefundRequest,
)


def main(base: str) -> None:
    anyone = Client(base_url=base, raise_on_unexpected_status=True)

    # Open an account; its API key is shown this once.
    opened = create_account.sync_detailed(
        client=anyone, body=NewAccountRequest(name="Ada", balance=1000, points=5)
    )
    assert opened.status_code == 201, opened
    ada = opened.parsed
    payonce = AuthenticatedClient(base_url=base, token=ada.api_key, raise_on_unexpected_status=True)

    account = get_account.sync(client=payonce, id=ada.id)
    assert (account.balance, account.available, account.points) == (1000, 1000, 5), account

    # Take a ticket, withdraw 300 with it: 201, balance 700.
    ticket = issue_ticket.sync(client=payonce, id=ada.id).ticket_id
    first = withdraw.sync_detailed(
        client=payonce, id=ada.id, body=MoneyRequest(amount=300), idempotency_key=str(ticket)
    )
    assert first.status_code == 201 and isinstance(first.parsed, MoneyMoved), first
    assert first.parsed.balance == 700
    assert first.headers.get("idempotent-replayed") != "true"

    # Exactly the same request again: the same answer, replayed; nothing moved.
    again = withdraw.sync_detailed(
        client=payonce, id=ada.id, body=MoneyRequest(amount=300), idempotency_key=str(ticket)
    )
    assert again.status_code == 201 and again.parsed == first.parsed, again
    assert again.headers.get("idempotent-replayed") == "true"

    # The same ticket for another request: 422 idempotency-key-reuse.
    reused = withdraw.sync_detailed(
        client=payonce, id=ada.id, body=MoneyRequest(amount=999), idempotency_key=str(ticket)
    )
    assert reused.status_code == 422 and isinstance(reused.parsed, Problem), reused
    assert reused.parsed.type_ == "/problems/idempotency-key-reuse", reused.parsed

    # The ticket remembers what it answered.
    shown = get_ticket.sync(client=payonce, ticket_id=ticket)
    assert str(shown.state) == "completed" and shown.response.status == 201, shown

    # A lottery draw with points.
    drawn = draw.sync_detailed(
        client=payonce,
        id=ada.id,
        body=DrawRequest(points=2),
        idempotency_key=str(issue_ticket.sync(client=payonce, id=ada.id).ticket_id),
    )
    assert drawn.status_code == 201 and drawn.parsed.points_after == 3, drawn

    # An order, paid once: a second payment with another ticket is 409.
    order = create_order.sync(
        client=payonce, id=ada.id, body=OrderRequest(amount=250, description="order #1017")
    )
    paying = issue_ticket.sync(client=payonce, id=ada.id).ticket_id
    paid = pay_order.sync_detailed(
        client=payonce, order_id=order.order_id, body=PaymentRequest(), idempotency_key=str(paying)
    )
    assert paid.status_code == 201 and str(paid.parsed.state) == "paid", paid
    twice = pay_order.sync_detailed(
        client=payonce,
        order_id=order.order_id,
        body=PaymentRequest(),
        idempotency_key=str(issue_ticket.sync(client=payonce, id=ada.id).ticket_id),
    )
    assert twice.status_code == 409, twice
    assert twice.parsed.type_ == "/problems/order-already-paid", twice.parsed
    assert get_order.sync(client=payonce, order_id=order.order_id).paid_by_ticket == paying

    # A hold of 200 sets money aside: the balance stays, `available` drops. Capture 120 of
    # it (the rest released at once), refund 50 of the capture, then 100 of the order.
    before = get_account.sync(client=payonce, id=ada.id).balance
    held = place_hold.sync_detailed(
        client=payonce,
        id=ada.id,
        body=HoldRequest(amount=200, expires_in=3600),
        idempotency_key=str(issue_ticket.sync(client=payonce, id=ada.id).ticket_id),
    )
    assert held.status_code == 201 and str(held.parsed.state) == "held", held
    assert (held.parsed.balance, held.parsed.available) == (before, before - 200), held.parsed
    hold = held.parsed.hold_id
    captured = capture_hold.sync_detailed(
        client=payonce,
        hold_id=hold,
        body=CaptureRequest(amount=120),
        idempotency_key=str(issue_ticket.sync(client=payonce, id=ada.id).ticket_id),
    )
    assert captured.status_code == 200, captured
    assert (str(captured.parsed.state), captured.parsed.captured_amount) == ("captured", 120)
    assert captured.parsed.balance == captured.parsed.available == before - 120, captured.parsed
    refunded = refund_hold.sync_detailed(
        client=payonce,
        hold_id=hold,
        body=RefundRequest(amount=50),
        idempotency_key=str(issue_ticket.sync(client=payonce, id=ada.id).ticket_id),
    )
    assert refunded.status_code == 201 and refunded.parsed.refundable == 70, refunded
    assert get_hold.sync(client=payonce, hold_id=hold).refunded_amount == 50
    order_refund = refund_order.sync_detailed(
        client=payonce,
        order_id=order.order_id,
        body=RefundRequest(amount=100),
        idempotency_key=str(issue_ticket.sync(client=payonce, id=ada.id).ticket_id),
    )
    assert order_refund.status_code == 201 and order_refund.parsed.refundable == 150, order_refund
    assert order_refund.parsed.balance == before - 120 + 50 + 100, order_refund.parsed

    # Another account's key reads nothing of Ada's.
    stranger = create_account.sync(client=anyone, body=NewAccountRequest(name="Eve"))
    theirs = AuthenticatedClient(base_url=base, token=stranger.api_key)
    assert get_account.sync_detailed(client=theirs, id=ada.id).status_code == 403

    assert isinstance(uuid.UUID(str(ada.id)), uuid.UUID)
    print("python client (openapi-python-client): the walkthrough passed")


if __name__ == "__main__":
    main(sys.argv[1])
