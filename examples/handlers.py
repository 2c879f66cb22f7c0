"""Deterministic tool handlers for the example catalog (``examples/catalog.json``).

Every handler is a plain ``async def handler(input, call)`` as
`cellblock.client.CellblockClient.exec` expects, keyed by catalog id. Host
handlers return ``{"content": [...], "details": ...}`` where ``details``
matches the tool's ``outputSchema`` (cellblock validates it). Client tools
stand in for UI round-trips and return canned answers.

Usage::

    from examples.data import load_tools
    from examples.handlers import HANDLERS

    await client.put_catalog(scope, load_tools())
    result = await client.exec(scope, tool_call_id="call_1", code=src, handlers=HANDLERS)

The rows the handlers serve are in :mod:`examples.data`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from cellblock.client import ToolCallInfo, ToolRefused
from examples.data import (
    CONTACTS,
    CUSTOMERS,
    DEALS,
    DOCS,
    EVENTS,
    INVOICE_LINES,
    INVOICES,
    LANES,
    PAYMENTS,
    REORDER_POINTS,
    STOCK,
    TICKETS,
    WAREHOUSES,
    shipments,
)

__all__ = ["HANDLERS"]

Handler = Callable[[dict[str, Any], ToolCallInfo], Awaitable[Any]]


def _reply(text: str, details: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "details": details}


def _limit(tool_input: dict[str, Any], default: int = 20) -> int:
    value = tool_input.get("limit", default)
    if not isinstance(value, int) or not 1 <= value <= 100:
        raise ToolRefused("invalid_input", "limit must be an integer between 1 and 100")
    return value


def _find(rows: list[dict[str, Any]], key: str, value: Any, what: str) -> dict[str, Any]:
    for row in rows:
        if row[key] == value:
            return row
    raise ToolRefused("invalid_input", f"unknown {what} {value!r}")


# ---------------------------------------------------------------------------
# shipping


async def shipping_list(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = shipments()
    unpaid = sum(1 for r in rows if not r["paid"])
    return _reply(f"{len(rows)} shipments, {unpaid} unpaid", rows)


async def shipping_quote(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    lane = (tool_input["origin"], tool_input["destination"])
    rate, days = LANES.get(lane, (95.0, 21))
    express = tool_input.get("service") == "express"
    price = round(rate * float(tool_input["tons"]) * (1.35 if express else 1.0), 2)
    quote = {
        "quoteId": f"Q-{lane[0]}-{lane[1]}-{int(float(tool_input['tons']) * 100)}",
        "currency": "EUR",
        "price": price,
        "transitDays": days - 7 if express else days,
    }
    return _reply(f"EUR {price:.2f}, {quote['transitDays']} days", quote)


async def shipping_track(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    shipment = _find(shipments(), "id", tool_input["shipmentId"], "shipment")
    events = [
        {"at": "2024-07-01T06:00:00Z", "location": "Rotterdam", "note": "Booked"},
        {"at": "2024-07-03T18:20:00Z", "location": "Rotterdam", "note": "Loaded on vessel"},
    ]
    status = "in_transit"
    if not shipment["paid"]:
        events.append({"at": "2024-07-04T09:00:00Z", "location": "Rotterdam", "note": "Held: payment outstanding"})
        status = "held"
    details = {"shipmentId": shipment["id"], "status": status, "events": events}
    return _reply(f"{shipment['id']}: {status}", details)


async def shipping_create_label(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    shipment = _find(shipments(), "id", tool_input["shipmentId"], "shipment")
    label_id = f"LBL-{tool_input['carrier'].upper()}-{shipment['id'][-4:]}"
    details = {"labelId": label_id, "shipmentId": shipment["id"], "url": f"https://labels.example/{label_id}.pdf"}
    return _reply(f"label {label_id} created", details)


async def shipping_cancel(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    shipment = _find(shipments(), "id", tool_input["shipmentId"], "shipment")
    if shipment["paid"]:
        raise ToolRefused("blocked", f"{shipment['id']} is paid; cancelling needs a refund approval first")
    return _reply(f"{shipment['id']} cancelled", {"shipmentId": shipment["id"], "cancelled": True})


# ---------------------------------------------------------------------------
# billing


async def list_invoices(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [
        inv
        for inv in INVOICES
        if tool_input.get("customerId") in (None, inv["customerId"]) and tool_input.get("status") in (None, inv["status"])
    ][: _limit(tool_input)]
    return _reply(f"{len(rows)} invoices", rows)


async def get_invoice(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    inv = _find(INVOICES, "id", tool_input["invoiceId"], "invoice")
    details = {k: inv[k] for k in ("id", "customerId", "amount", "currency", "status")}
    details["lines"] = INVOICE_LINES.get(inv["id"], [{"sku": "SRV-FEE", "description": "Service fee", "quantity": 1, "unitPrice": inv["amount"]}])
    return _reply(f"{inv['id']}: {inv['currency']} {inv['amount']:.2f} ({inv['status']})", details)


async def create_invoice(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    _find(CUSTOMERS, "id", tool_input["customerId"], "customer")
    prices = {"PAL-EUR-1200": 14.5, "CRT-FLD-60": 9.9, "STR-PET-16": 42.0, "WRP-STR-500": 18.75}
    amount = round(sum(prices.get(line["sku"], 10.0) * line["quantity"] for line in tool_input["lines"]), 2)
    details = {"id": f"INV-DRAFT-{call.nested_call_id[-6:]}", "status": "draft", "amount": amount}
    return _reply(f"draft invoice over EUR {amount:.2f}", details)


async def list_payments(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [p for p in PAYMENTS if tool_input.get("invoiceId") in (None, p["invoiceId"])][: _limit(tool_input)]
    return _reply(f"{len(rows)} payments", rows)


async def refund_payment(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    payment = _find(PAYMENTS, "id", tool_input["paymentId"], "payment")
    amount = float(tool_input.get("amount", payment["amount"]))
    if amount > payment["amount"]:
        raise ToolRefused("invalid_input", f"refund {amount} exceeds payment {payment['amount']}")
    if amount > 5000:
        raise ToolRefused("blocked", "refunds above EUR 5,000 need a second approver")
    details = {"refundId": f"RF-{payment['id'][-4:]}", "paymentId": payment["id"], "amount": amount, "status": "pending"}
    return _reply(f"refund of {amount:.2f} pending", details)


# ---------------------------------------------------------------------------
# inventory


async def inventory_list(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [
        s
        for s in STOCK
        if tool_input.get("warehouseId") in (None, s["warehouseId"])
        and (not tool_input.get("lowStockOnly") or s["onHand"] - s["reserved"] <= REORDER_POINTS[s["sku"]])
    ]
    return _reply(f"{len(rows)} stock rows", rows)


async def inventory_get_item(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [s for s in STOCK if s["sku"] == tool_input["sku"]]
    if not rows:
        raise ToolRefused("invalid_input", f"unknown SKU {tool_input['sku']!r}")
    details = {
        "sku": rows[0]["sku"],
        "name": rows[0]["name"],
        "onHand": sum(r["onHand"] for r in rows),
        "reserved": sum(r["reserved"] for r in rows),
        "reorderPoint": REORDER_POINTS[rows[0]["sku"]],
        "warehouses": [{"warehouseId": r["warehouseId"], "onHand": r["onHand"]} for r in rows],
    }
    return _reply(f"{details['sku']}: {details['onHand']} on hand", details)


async def inventory_adjust(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    row = next((s for s in STOCK if s["sku"] == tool_input["sku"] and s["warehouseId"] == tool_input["warehouseId"]), None)
    if row is None:
        raise ToolRefused("invalid_input", f"{tool_input['sku']} is not stocked in {tool_input['warehouseId']}")
    on_hand = row["onHand"] + int(tool_input["delta"])
    if on_hand < 0:
        raise ToolRefused("invalid_input", "the adjustment would make stock negative")
    return _reply(f"{row['sku']} in {row['warehouseId']}: {on_hand}", {"sku": row["sku"], "warehouseId": row["warehouseId"], "onHand": on_hand})


async def inventory_reserve(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    free = sum(s["onHand"] - s["reserved"] for s in STOCK if s["sku"] == tool_input["sku"])
    if tool_input["quantity"] > free:
        raise ToolRefused("failed", f"only {free} units of {tool_input['sku']} are free")
    details = {"reservationId": f"RSV-{tool_input['orderId']}", "sku": tool_input["sku"], "quantity": tool_input["quantity"]}
    return _reply(f"reserved {tool_input['quantity']}", details)


async def list_warehouses(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    return _reply(f"{len(WAREHOUSES)} warehouses", WAREHOUSES)


# ---------------------------------------------------------------------------
# crm


async def list_customers(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [c for c in CUSTOMERS if tool_input.get("segment") in (None, c["segment"])][: _limit(tool_input)]
    return _reply(f"{len(rows)} customers", rows)


async def get_customer(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    customer = _find(CUSTOMERS, "id", tool_input["customerId"], "customer")
    open_invoices = sum(1 for inv in INVOICES if inv["customerId"] == customer["id"] and inv["status"] == "open")
    details = {
        **customer,
        "email": f"billing@{customer['id'].lower()}.example",
        "openInvoices": open_invoices,
        "accountManager": "Priya Raman" if customer["segment"] == "enterprise" else "Tom Okafor",
    }
    return _reply(f"{customer['name']} ({customer['segment']})", details)


async def update_customer(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    customer = _find(CUSTOMERS, "id", tool_input["customerId"], "customer")
    updated = bool({"email", "segment"} & tool_input.keys())
    return _reply("updated" if updated else "nothing to update", {"id": customer["id"], "updated": updated})


async def search_contacts(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    words = tool_input["query"].lower().split()
    rows = [c for c in CONTACTS if all(w in f"{c['name']} {c['email']} {c['role']}".lower() for w in words)]
    return _reply(f"{len(rows)} contacts", rows[: _limit(tool_input)])


async def list_deals(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [d for d in DEALS if tool_input.get("stage") in (None, d["stage"])]
    return _reply(f"{len(rows)} deals", rows)


# ---------------------------------------------------------------------------
# docs, calendar, support, reports


async def docs_search(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    words = tool_input["query"].lower().split()
    hits = []
    for doc in DOCS:
        body = f"{doc['title']} {doc['text']}".lower()
        score = sum(body.count(w) for w in words)
        if score:
            hits.append({"path": doc["path"], "title": doc["title"], "score": float(score)})
    hits.sort(key=lambda h: (-h["score"], h["path"]))
    return _reply(f"{len(hits)} pages", hits[: _limit(tool_input, 5)])


async def docs_read(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    doc = _find(DOCS, "path", tool_input["path"], "page")
    return _reply(doc["text"], {**doc, "updatedAt": "2024-06-01T00:00:00Z"})


async def docs_list(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [{"path": d["path"], "title": d["title"]} for d in DOCS if d["path"].startswith(tool_input.get("prefix", ""))]
    return _reply(f"{len(rows)} pages", rows)


async def calendar_list_events(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [ev for ev in EVENTS if tool_input["from"] <= ev["start"] < tool_input["to"]]
    return _reply(f"{len(rows)} events", rows)


async def calendar_create_event(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    if tool_input["end"] <= tool_input["start"]:
        raise ToolRefused("invalid_input", "end must be after start")
    details = {"id": f"EV-{call.nested_call_id[-4:]}", "title": tool_input["title"], "start": tool_input["start"], "end": tool_input["end"]}
    return _reply(f"created {details['id']}", details)


async def calendar_free_busy(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [
        {
            "attendee": who,
            "busy": [
                {"start": ev["start"], "end": ev["end"]}
                for ev in EVENTS
                if who in ev["attendees"] and tool_input["from"] <= ev["start"] < tool_input["to"]
            ],
        }
        for who in tool_input["attendees"]
    ]
    return _reply(f"free/busy for {len(rows)} people", rows)


async def list_tickets(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [
        t
        for t in TICKETS
        if tool_input.get("status") in (None, t["status"]) and tool_input.get("customerId") in (None, t["customerId"])
    ]
    return _reply(f"{len(rows)} tickets", rows)


async def get_ticket(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    ticket = _find(TICKETS, "id", tool_input["ticketId"], "ticket")
    messages = [
        {"from": "customer", "at": "2024-07-18T07:55:00Z", "body": f"Hello, about '{ticket['subject']}'."},
        {"from": "agent", "at": "2024-07-18T09:10:00Z", "body": "Thanks, we are looking into it."},
    ]
    return _reply(ticket["subject"], {**ticket, "messages": messages})


async def generate_report(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    # No outputSchema: the layout is deliberately not declared (quick index `-> ?`).
    kind, month = tool_input["kind"], tool_input["month"]
    if kind == "revenue":
        body: Any = {"month": month, "byCurrency": {"EUR": 45963.0, "USD": 18250.0}}
    elif kind == "backlog":
        body = {"month": month, "openInvoices": 2, "openTickets": 2}
    else:
        body = [{"sku": s["sku"], "turns": round(10 * s["reserved"] / max(s["onHand"], 1), 2)} for s in STOCK]
    return _reply(f"{kind} report for {month}", body)


# ---------------------------------------------------------------------------
# client tools (UI round-trips, simulated)


async def select_file(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    return {"name": "manifest.csv", "text": "id,tons\nSHP-1002,14\nSHP-1004,22.75\n"}


async def confirm_action(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    return {"confirmed": True}


async def show_notification(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    return {"shown": True}


async def open_url(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    if not str(tool_input.get("url", "")).startswith("https://"):
        raise ToolRefused("blocked", "only https URLs may be opened")
    return {"opened": True}


async def list_open_tabs(tool_input: dict[str, Any], call: ToolCallInfo) -> list[dict[str, str]]:
    return [{"title": "Shipments - Acme TMS", "url": "https://tms.example/shipments"}]


async def clipboard_read(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    return {"text": "SHP-1004"}


HANDLERS: dict[str, Handler] = {
    "host:shipping:shipping_list": shipping_list,
    "host:shipping:shipping_quote": shipping_quote,
    "host:shipping:shipping_track": shipping_track,
    "host:shipping:shipping_create_label": shipping_create_label,
    "host:shipping:shipping_cancel": shipping_cancel,
    "host:billing:list_invoices": list_invoices,
    "host:billing:get_invoice": get_invoice,
    "host:billing:create_invoice": create_invoice,
    "host:billing:list_payments": list_payments,
    "host:billing:refund_payment": refund_payment,
    "host:inventory:inventory_list": inventory_list,
    "host:inventory:inventory_get_item": inventory_get_item,
    "host:inventory:inventory_adjust": inventory_adjust,
    "host:inventory:inventory_reserve": inventory_reserve,
    "host:inventory:list_warehouses": list_warehouses,
    "host:crm:list_customers": list_customers,
    "host:crm:get_customer": get_customer,
    "host:crm:update_customer": update_customer,
    "host:crm:search_contacts": search_contacts,
    "host:crm:list_deals": list_deals,
    "host:docs:docs_search": docs_search,
    "host:docs:docs_read": docs_read,
    "host:docs:docs_list": docs_list,
    "host:calendar:calendar_list_events": calendar_list_events,
    "host:calendar:calendar_create_event": calendar_create_event,
    "host:calendar:calendar_free_busy": calendar_free_busy,
    "host:support:list_tickets": list_tickets,
    "host:support:get_ticket": get_ticket,
    "host:reports:generate_report": generate_report,
    "client:app:select_file": select_file,
    "client:app:confirm_action": confirm_action,
    "client:app:show_notification": show_notification,
    "client:app:open_url": open_url,
    "client:app:list_open_tabs": list_open_tabs,
    "client:app:clipboard_read": clipboard_read,
}
"""Handlers by catalog id, for `CellblockClient.exec(handlers=...)`."""
