"""Deterministic tool handlers for the example catalog (``examples/catalog.json``).

Every handler is a plain ``async def handler(input, call)`` as
`cellblock.client.CellblockClient.exec` expects, keyed by catalog id. Host
handlers return ``{"content": [...], "details": ...}`` where ``details``
matches the tool's ``outputSchema`` (cellblock validates it). Client tools
stand in for UI round-trips and return canned answers.

Usage::

    from examples.handlers import HANDLERS, load_tools

    await client.put_catalog(scope, load_tools())
    result = await client.exec(scope, tool_call_id="call_1", code=src, handlers=HANDLERS)

The shipment data comes from ``fixtures.shipments`` in ``catalog.json`` so that
``tests/interop/exec_client.js`` serves exactly the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import Any

from cellblock.client import ToolCallInfo, ToolRefused

__all__ = ["CATALOG_PATH", "HANDLERS", "PROGRAMS_DIR", "load_fixtures", "load_tools", "program"]

CATALOG_PATH = Path(__file__).with_name("catalog.json")
"""The example catalog: ``{"tools": [...], "fixtures": {...}}``."""
PROGRAMS_DIR = Path(__file__).with_name("programs")
"""Example guest programs (``*.js``)."""

Handler = Callable[[dict[str, Any], ToolCallInfo], Awaitable[Any]]


@cache
def _catalog() -> dict[str, Any]:
    return json.loads(CATALOG_PATH.read_text(encoding="utf-8"))


def load_tools(*, owners: set[str] | None = None) -> list[dict[str, Any]]:
    """Returns the example tools in the SPEC §3.2 registration shape.

    Args:
        owners: Only tools of these owners (e.g. ``{"shipping"}``); ``None`` for all.

    Returns:
        A fresh list of tool dicts, ready for `CellblockClient.put_catalog`.
    """
    tools = json.loads(json.dumps(_catalog()["tools"]))
    return [t for t in tools if owners is None or t.get("owner") in owners]


def load_fixtures() -> dict[str, Any]:
    """Returns the fixture data shared with the Node interop client."""
    return json.loads(json.dumps(_catalog()["fixtures"]))


def program(name: str) -> str:
    """Returns the source of ``examples/programs/<name>.js``."""
    return (PROGRAMS_DIR / f"{name}.js").read_text(encoding="utf-8")


def _reply(text: str, details: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "details": details}


def _limit(tool_input: dict[str, Any], default: int = 20) -> int:
    value = tool_input.get("limit", default)
    if not isinstance(value, int) or not 1 <= value <= 100:
        raise ToolRefused("invalid_input", "limit must be an integer between 1 and 100")
    return value


# ---------------------------------------------------------------------------
# Data

_CUSTOMERS: list[dict[str, Any]] = [
    {"id": "CUS-001", "name": "Rotterdam Bulk Traders", "segment": "enterprise", "country": "NL"},
    {"id": "CUS-002", "name": "Nordlicht Logistik GmbH", "segment": "enterprise", "country": "DE"},
    {"id": "CUS-003", "name": "Café Azul", "segment": "smb", "country": "PT"},
    {"id": "CUS-004", "name": "Kestrel Outdoor", "segment": "smb", "country": "GB"},
    {"id": "CUS-005", "name": "Maya Lindqvist", "segment": "consumer", "country": "SE"},
    {"id": "CUS-006", "name": "Pacific Rim Foods", "segment": "enterprise", "country": "SG"},
    {"id": "CUS-007", "name": "Atelier Brun", "segment": "smb", "country": "FR"},
]
_INVOICES: list[dict[str, Any]] = [
    {"id": "INV-2024-0047", "customerId": "CUS-006", "amount": 18250.0, "currency": "USD", "status": "open", "dueDate": "2024-07-31"},
    {"id": "INV-2024-0046", "customerId": "CUS-001", "amount": 9400.5, "currency": "EUR", "status": "open", "dueDate": "2024-07-28"},
    {"id": "INV-2024-0045", "customerId": "CUS-003", "amount": 312.4, "currency": "EUR", "status": "paid", "dueDate": "2024-07-15"},
    {"id": "INV-2024-0044", "customerId": "CUS-002", "amount": 12780.0, "currency": "EUR", "status": "paid", "dueDate": "2024-07-10"},
    {"id": "INV-2024-0043", "customerId": "CUS-007", "amount": 1460.0, "currency": "EUR", "status": "void", "dueDate": "2024-07-02"},
    {"id": "INV-2024-0042", "customerId": "CUS-001", "amount": 22010.0, "currency": "EUR", "status": "paid", "dueDate": "2024-06-30"},
]
_INVOICE_LINES: dict[str, list[dict[str, Any]]] = {
    "INV-2024-0042": [
        {"sku": "PAL-EUR-1200", "description": "Euro pallet 1200x800", "quantity": 400, "unitPrice": 14.5},
        {"sku": "FRT-SEA-TEU", "description": "Sea freight per TEU", "quantity": 8, "unitPrice": 2026.25},
    ],
}
_PAYMENTS: list[dict[str, Any]] = [
    {"id": "PAY-9003", "invoiceId": "INV-2024-0045", "amount": 312.4, "method": "card", "receivedAt": "2024-07-14T09:12:00Z"},
    {"id": "PAY-9002", "invoiceId": "INV-2024-0044", "amount": 12780.0, "method": "sepa", "receivedAt": "2024-07-09T16:40:00Z"},
    {"id": "PAY-9001", "invoiceId": "INV-2024-0042", "amount": 22010.0, "method": "wire", "receivedAt": "2024-06-28T11:05:00Z"},
]
_WAREHOUSES: list[dict[str, Any]] = [
    {"id": "WH-RTM", "city": "Rotterdam", "country": "NL", "capacityTons": 12000.0},
    {"id": "WH-HAM", "city": "Hamburg", "country": "DE", "capacityTons": 8500.0},
    {"id": "WH-SIN", "city": "Singapore", "country": "SG", "capacityTons": 15000.0},
]
_STOCK: list[dict[str, Any]] = [
    {"sku": "PAL-EUR-1200", "name": "Euro pallet 1200x800", "warehouseId": "WH-RTM", "onHand": 1800, "reserved": 400},
    {"sku": "PAL-EUR-1200", "name": "Euro pallet 1200x800", "warehouseId": "WH-HAM", "onHand": 260, "reserved": 0},
    {"sku": "CRT-FLD-60", "name": "Foldable crate 60 l", "warehouseId": "WH-RTM", "onHand": 35, "reserved": 30},
    {"sku": "STR-PET-16", "name": "PET strapping 16 mm", "warehouseId": "WH-SIN", "onHand": 90, "reserved": 10},
    {"sku": "WRP-STR-500", "name": "Stretch wrap 500 mm", "warehouseId": "WH-HAM", "onHand": 12, "reserved": 0},
]
_REORDER_POINTS = {"PAL-EUR-1200": 500, "CRT-FLD-60": 50, "STR-PET-16": 40, "WRP-STR-500": 20}
_CONTACTS: list[dict[str, Any]] = [
    {"id": "CON-11", "customerId": "CUS-001", "name": "Joost de Vries", "email": "joost@rbt.example", "role": "Head of Procurement"},
    {"id": "CON-12", "customerId": "CUS-001", "name": "Anouk Smit", "email": "anouk@rbt.example", "role": "Accounts Payable"},
    {"id": "CON-21", "customerId": "CUS-002", "name": "Lena Vogt", "email": "l.vogt@nordlicht.example", "role": "Logistics Manager"},
    {"id": "CON-61", "customerId": "CUS-006", "name": "Wei Ling Tan", "email": "weiling@prf.example", "role": "Supply Chain Director"},
]
_DEALS: list[dict[str, Any]] = [
    {"id": "DL-301", "customerId": "CUS-006", "title": "Reefer capacity Q4", "stage": "proposal", "value": 240000.0},
    {"id": "DL-302", "customerId": "CUS-002", "title": "Hamburg cross-dock", "stage": "qualified", "value": 86000.0},
    {"id": "DL-303", "customerId": "CUS-004", "title": "Retail replenishment", "stage": "lead", "value": 12000.0},
    {"id": "DL-304", "customerId": "CUS-001", "title": "Bulk grain 2025", "stage": "won", "value": 510000.0},
]
_DOCS: list[dict[str, Any]] = [
    {"path": "ops/customs.md", "title": "Customs clearance checklist", "text": "1. Commercial invoice. 2. Packing list. 3. EORI number."},
    {"path": "ops/dangerous-goods.md", "title": "Dangerous goods (IMDG)", "text": "Class 3 liquids need a DG declaration 48 h before cut-off."},
    {"path": "finance/refunds.md", "title": "Refund policy", "text": "Refunds above EUR 5,000 need a second approver."},
    {"path": "sales/pricing.md", "title": "Freight pricing rules", "text": "Express adds 35 % to the standard lane rate."},
]
_EVENTS: list[dict[str, Any]] = [
    {"id": "EV-1", "title": "Weekly ops sync", "start": "2024-07-22T08:00:00Z", "end": "2024-07-22T08:30:00Z", "attendees": ["ops@acme.example"]},
    {"id": "EV-2", "title": "Pacific Rim Foods QBR", "start": "2024-07-23T13:00:00Z", "end": "2024-07-23T14:00:00Z", "attendees": ["sales@acme.example", "weiling@prf.example"]},
    {"id": "EV-3", "title": "Customs audit prep", "start": "2024-07-25T10:00:00Z", "end": "2024-07-25T11:30:00Z", "attendees": ["ops@acme.example", "legal@acme.example"]},
]
_TICKETS: list[dict[str, Any]] = [
    {"id": "TCK-311", "customerId": "CUS-003", "subject": "Pallet arrived damaged", "status": "open", "priority": "high"},
    {"id": "TCK-310", "customerId": "CUS-006", "subject": "Invoice currency wrong", "status": "pending", "priority": "normal"},
    {"id": "TCK-305", "customerId": "CUS-001", "subject": "Tracking page not updating", "status": "closed", "priority": "low"},
]
_LANES = {("NLRTM", "SGSIN"): (118.0, 28), ("NLRTM", "USNYC"): (74.0, 11), ("DEHAM", "SGSIN"): (121.5, 30)}


def _shipments() -> list[dict[str, Any]]:
    return load_fixtures()["shipments"]


def _find(rows: list[dict[str, Any]], key: str, value: Any, what: str) -> dict[str, Any]:
    for row in rows:
        if row[key] == value:
            return row
    raise ToolRefused("invalid_input", f"unknown {what} {value!r}")


# ---------------------------------------------------------------------------
# shipping


async def shipping_list(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = _shipments()
    unpaid = sum(1 for r in rows if not r["paid"])
    return _reply(f"{len(rows)} shipments, {unpaid} unpaid", rows)


async def shipping_quote(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    lane = (tool_input["origin"], tool_input["destination"])
    rate, days = _LANES.get(lane, (95.0, 21))
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
    shipment = _find(_shipments(), "id", tool_input["shipmentId"], "shipment")
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
    shipment = _find(_shipments(), "id", tool_input["shipmentId"], "shipment")
    label_id = f"LBL-{tool_input['carrier'].upper()}-{shipment['id'][-4:]}"
    details = {"labelId": label_id, "shipmentId": shipment["id"], "url": f"https://labels.example/{label_id}.pdf"}
    return _reply(f"label {label_id} created", details)


async def shipping_cancel(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    shipment = _find(_shipments(), "id", tool_input["shipmentId"], "shipment")
    if shipment["paid"]:
        raise ToolRefused("blocked", f"{shipment['id']} is paid; cancelling needs a refund approval first")
    return _reply(f"{shipment['id']} cancelled", {"shipmentId": shipment["id"], "cancelled": True})


# ---------------------------------------------------------------------------
# billing


async def list_invoices(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [
        inv
        for inv in _INVOICES
        if tool_input.get("customerId") in (None, inv["customerId"]) and tool_input.get("status") in (None, inv["status"])
    ][: _limit(tool_input)]
    return _reply(f"{len(rows)} invoices", rows)


async def get_invoice(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    inv = _find(_INVOICES, "id", tool_input["invoiceId"], "invoice")
    details = {k: inv[k] for k in ("id", "customerId", "amount", "currency", "status")}
    details["lines"] = _INVOICE_LINES.get(inv["id"], [{"sku": "SRV-FEE", "description": "Service fee", "quantity": 1, "unitPrice": inv["amount"]}])
    return _reply(f"{inv['id']}: {inv['currency']} {inv['amount']:.2f} ({inv['status']})", details)


async def create_invoice(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    _find(_CUSTOMERS, "id", tool_input["customerId"], "customer")
    prices = {"PAL-EUR-1200": 14.5, "CRT-FLD-60": 9.9, "STR-PET-16": 42.0, "WRP-STR-500": 18.75}
    amount = round(sum(prices.get(line["sku"], 10.0) * line["quantity"] for line in tool_input["lines"]), 2)
    details = {"id": f"INV-DRAFT-{call.nested_call_id[-6:]}", "status": "draft", "amount": amount}
    return _reply(f"draft invoice over EUR {amount:.2f}", details)


async def list_payments(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [p for p in _PAYMENTS if tool_input.get("invoiceId") in (None, p["invoiceId"])][: _limit(tool_input)]
    return _reply(f"{len(rows)} payments", rows)


async def refund_payment(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    payment = _find(_PAYMENTS, "id", tool_input["paymentId"], "payment")
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
        for s in _STOCK
        if tool_input.get("warehouseId") in (None, s["warehouseId"])
        and (not tool_input.get("lowStockOnly") or s["onHand"] - s["reserved"] <= _REORDER_POINTS[s["sku"]])
    ]
    return _reply(f"{len(rows)} stock rows", rows)


async def inventory_get_item(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [s for s in _STOCK if s["sku"] == tool_input["sku"]]
    if not rows:
        raise ToolRefused("invalid_input", f"unknown SKU {tool_input['sku']!r}")
    details = {
        "sku": rows[0]["sku"],
        "name": rows[0]["name"],
        "onHand": sum(r["onHand"] for r in rows),
        "reserved": sum(r["reserved"] for r in rows),
        "reorderPoint": _REORDER_POINTS[rows[0]["sku"]],
        "warehouses": [{"warehouseId": r["warehouseId"], "onHand": r["onHand"]} for r in rows],
    }
    return _reply(f"{details['sku']}: {details['onHand']} on hand", details)


async def inventory_adjust(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    row = next((s for s in _STOCK if s["sku"] == tool_input["sku"] and s["warehouseId"] == tool_input["warehouseId"]), None)
    if row is None:
        raise ToolRefused("invalid_input", f"{tool_input['sku']} is not stocked in {tool_input['warehouseId']}")
    on_hand = row["onHand"] + int(tool_input["delta"])
    if on_hand < 0:
        raise ToolRefused("invalid_input", "the adjustment would make stock negative")
    return _reply(f"{row['sku']} in {row['warehouseId']}: {on_hand}", {"sku": row["sku"], "warehouseId": row["warehouseId"], "onHand": on_hand})


async def inventory_reserve(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    free = sum(s["onHand"] - s["reserved"] for s in _STOCK if s["sku"] == tool_input["sku"])
    if tool_input["quantity"] > free:
        raise ToolRefused("failed", f"only {free} units of {tool_input['sku']} are free")
    details = {"reservationId": f"RSV-{tool_input['orderId']}", "sku": tool_input["sku"], "quantity": tool_input["quantity"]}
    return _reply(f"reserved {tool_input['quantity']}", details)


async def list_warehouses(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    return _reply(f"{len(_WAREHOUSES)} warehouses", _WAREHOUSES)


# ---------------------------------------------------------------------------
# crm


async def list_customers(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [c for c in _CUSTOMERS if tool_input.get("segment") in (None, c["segment"])][: _limit(tool_input)]
    return _reply(f"{len(rows)} customers", rows)


async def get_customer(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    customer = _find(_CUSTOMERS, "id", tool_input["customerId"], "customer")
    open_invoices = sum(1 for inv in _INVOICES if inv["customerId"] == customer["id"] and inv["status"] == "open")
    details = {
        **customer,
        "email": f"billing@{customer['id'].lower()}.example",
        "openInvoices": open_invoices,
        "accountManager": "Priya Raman" if customer["segment"] == "enterprise" else "Tom Okafor",
    }
    return _reply(f"{customer['name']} ({customer['segment']})", details)


async def update_customer(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    customer = _find(_CUSTOMERS, "id", tool_input["customerId"], "customer")
    updated = bool({"email", "segment"} & tool_input.keys())
    return _reply("updated" if updated else "nothing to update", {"id": customer["id"], "updated": updated})


async def search_contacts(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    words = tool_input["query"].lower().split()
    rows = [c for c in _CONTACTS if all(w in f"{c['name']} {c['email']} {c['role']}".lower() for w in words)]
    return _reply(f"{len(rows)} contacts", rows[: _limit(tool_input)])


async def list_deals(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [d for d in _DEALS if tool_input.get("stage") in (None, d["stage"])]
    return _reply(f"{len(rows)} deals", rows)


# ---------------------------------------------------------------------------
# docs, calendar, support, reports


async def docs_search(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    words = tool_input["query"].lower().split()
    hits = []
    for doc in _DOCS:
        body = f"{doc['title']} {doc['text']}".lower()
        score = sum(body.count(w) for w in words)
        if score:
            hits.append({"path": doc["path"], "title": doc["title"], "score": float(score)})
    hits.sort(key=lambda h: (-h["score"], h["path"]))
    return _reply(f"{len(hits)} pages", hits[: _limit(tool_input, 5)])


async def docs_read(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    doc = _find(_DOCS, "path", tool_input["path"], "page")
    return _reply(doc["text"], {**doc, "updatedAt": "2024-06-01T00:00:00Z"})


async def docs_list(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [{"path": d["path"], "title": d["title"]} for d in _DOCS if d["path"].startswith(tool_input.get("prefix", ""))]
    return _reply(f"{len(rows)} pages", rows)


async def calendar_list_events(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [ev for ev in _EVENTS if tool_input["from"] <= ev["start"] < tool_input["to"]]
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
                for ev in _EVENTS
                if who in ev["attendees"] and tool_input["from"] <= ev["start"] < tool_input["to"]
            ],
        }
        for who in tool_input["attendees"]
    ]
    return _reply(f"free/busy for {len(rows)} people", rows)


async def list_tickets(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    rows = [
        t
        for t in _TICKETS
        if tool_input.get("status") in (None, t["status"]) and tool_input.get("customerId") in (None, t["customerId"])
    ]
    return _reply(f"{len(rows)} tickets", rows)


async def get_ticket(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    ticket = _find(_TICKETS, "id", tool_input["ticketId"], "ticket")
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
        body = [{"sku": s["sku"], "turns": round(10 * s["reserved"] / max(s["onHand"], 1), 2)} for s in _STOCK]
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
