// The README's walkthrough through a TypeScript client: types generated from payonce's
// OpenAPI document by openapi-typescript, requests by openapi-fetch, without edits.
// Type-checked with `tsc --strict`, then run: tsx walkthrough.ts BASE_URL.
// Run by scripts/clients.sh; exits non-zero on any answer the walkthrough does not expect.
import createClient from "openapi-fetch";
import type { paths } from "./schema";

function check(condition: boolean, what: string, seen?: unknown): asserts condition {
  if (!condition) {
    throw new Error(`${what}: ${JSON.stringify(seen)}`);
  }
}

const base = process.argv[2];
const anyone = createClient<paths>({ baseUrl: base });

// Open an account; its API key is shown this once.
const opened = await anyone.POST("/v1/accounts", {
  body: { name: "Ada", balance: 1000, points: 5 },
});
check(opened.response.status === 201 && opened.data !== undefined, "opened", opened.error);
const ada = opened.data;
const payonce = createClient<paths>({
  baseUrl: base,
  headers: { Authorization: `Bearer ${ada.api_key}` },
});
const account = { params: { path: { id: ada.id } } };

const read = await payonce.GET("/v1/accounts/{id}", account);
check(
  read.data?.balance === 1000 && read.data.available === 1000 && read.data.points === 5,
  "read",
  read.data,
);

async function ticket(): Promise<string> {
  const issued = await payonce.POST("/v1/accounts/{id}/tickets", account);
  check(issued.data !== undefined, "ticket", issued.error);
  return issued.data.ticket_id;
}

// Take a ticket, withdraw 300 with it: 201, balance 700.
const spent = await ticket();
const withdraw = (amount: number) =>
  payonce.POST("/v1/accounts/{id}/withdrawals", {
    params: { path: { id: ada.id }, header: { "Idempotency-Key": spent } },
    body: { amount },
  });
const first = await withdraw(300);
check(first.response.status === 201 && first.data?.balance === 700, "withdrawal", first.data);
check(first.response.headers.get("idempotent-replayed") !== "true", "first not replayed");

// Exactly the same request again: the same answer, replayed; nothing moved.
const again = await withdraw(300);
check(
  again.response.status === 201 && JSON.stringify(again.data) === JSON.stringify(first.data),
  "replay",
  again.data,
);
check(again.response.headers.get("idempotent-replayed") === "true", "replayed header");

// The same ticket for another request: 422 idempotency-key-reuse.
const reused = await withdraw(999);
check(
  reused.response.status === 422 && reused.error?.type === "/problems/idempotency-key-reuse",
  "reuse",
  reused.error,
);

// The ticket remembers what it answered.
const shown = await payonce.GET("/v1/tickets/{ticket_id}", {
  params: { path: { ticket_id: spent } },
});
check(shown.data?.state === "completed" && shown.data.response?.status === 201, "ticket", shown.data);

// A lottery draw with points.
const drawn = await payonce.POST("/v1/accounts/{id}/lottery-draws", {
  params: { path: { id: ada.id }, header: { "Idempotency-Key": await ticket() } },
  body: { points: 2 },
});
check(drawn.response.status === 201 && drawn.data?.points_after === 3, "draw", drawn.data);

// An order, paid once: a second payment with another ticket is 409.
const placed = await payonce.POST("/v1/accounts/{id}/orders", {
  params: { path: { id: ada.id } },
  body: { amount: 250, description: "order #1017" },
});
check(placed.data !== undefined, "order", placed.error);
const order = placed.data.order_id;
const paying = await ticket();
const pay = (key: string) =>
  payonce.POST("/v1/orders/{order_id}/payments", {
    params: { path: { order_id: order }, header: { "Idempotency-Key": key } },
    body: {},
  });
const paid = await pay(paying);
check(paid.response.status === 201 && paid.data?.state === "paid", "paid", paid.data);
const twice = await pay(await ticket());
check(
  twice.response.status === 409 && twice.error?.type === "/problems/order-already-paid",
  "paid twice",
  twice.error,
);
const seen = await payonce.GET("/v1/orders/{order_id}", { params: { path: { order_id: order } } });
check(seen.data?.paid_by_ticket === paying, "paid by", seen.data);

// A hold of 200 sets money aside: the balance stays, `available` drops. Capture 120 of it
// (the rest released at once), refund 50 of the capture, then 100 of the order.
const before = (await payonce.GET("/v1/accounts/{id}", account)).data?.balance;
check(before !== undefined, "balance before");
const held = await payonce.POST("/v1/accounts/{id}/holds", {
  params: { path: { id: ada.id }, header: { "Idempotency-Key": await ticket() } },
  body: { amount: 200, expires_in: 3600 },
});
check(
  held.response.status === 201 &&
    held.data?.state === "held" &&
    held.data.balance === before &&
    held.data.available === before - 200,
  "hold",
  held.data,
);
const hold = held.data.hold_id;
const captured = await payonce.POST("/v1/holds/{hold_id}/capture", {
  params: { path: { hold_id: hold }, header: { "Idempotency-Key": await ticket() } },
  body: { amount: 120 },
});
check(
  captured.response.status === 200 &&
    captured.data?.state === "captured" &&
    captured.data.captured_amount === 120 &&
    captured.data.available === before - 120,
  "capture",
  captured.data,
);
const refunded = await payonce.POST("/v1/holds/{hold_id}/refunds", {
  params: { path: { hold_id: hold }, header: { "Idempotency-Key": await ticket() } },
  body: { amount: 50 },
});
check(refunded.response.status === 201 && refunded.data?.refundable === 70, "refund", refunded.data);
const readHold = await payonce.GET("/v1/holds/{hold_id}", { params: { path: { hold_id: hold } } });
check(readHold.data?.refunded_amount === 50, "hold read", readHold.data);
const orderRefund = await payonce.POST("/v1/orders/{order_id}/refunds", {
  params: { path: { order_id: order }, header: { "Idempotency-Key": await ticket() } },
  body: { amount: 100 },
});
check(
  orderRefund.response.status === 201 &&
    orderRefund.data?.refundable === 150 &&
    orderRefund.data.balance === before - 120 + 50 + 100,
  "order refund",
  orderRefund.data,
);

console.log("typescript client (openapi-typescript + openapi-fetch): the walkthrough passed");
