"""The example catalog's data, as :mod:`examples.handlers` serves it.

``catalog.json`` (tools and fixtures), the guest programs, and the in-memory rows.

The shipment rows come from ``fixtures.shipments`` in ``catalog.json`` so that
``tests/interop/exec_client.js`` serves exactly the same rows.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "CATALOG_PATH",
    "PROGRAMS_DIR",
    "CONTACTS",
    "CUSTOMERS",
    "DEALS",
    "DOCS",
    "EVENTS",
    "INVOICES",
    "INVOICE_LINES",
    "LANES",
    "PAYMENTS",
    "REORDER_POINTS",
    "STOCK",
    "TICKETS",
    "WAREHOUSES",
    "shipments",
    "load_fixtures",
    "load_tools",
    "program",
]

CATALOG_PATH = Path(__file__).with_name("catalog.json")
"""The example catalog: ``{"tools": [...], "fixtures": {...}}``."""
PROGRAMS_DIR = Path(__file__).with_name("programs")
"""Example guest programs (``*.js``)."""


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



# ---------------------------------------------------------------------------
# Rows

CUSTOMERS: list[dict[str, Any]] = [
    {"id": "CUS-001", "name": "Rotterdam Bulk Traders", "segment": "enterprise", "country": "NL"},
    {"id": "CUS-002", "name": "Nordlicht Logistik GmbH", "segment": "enterprise", "country": "DE"},
    {"id": "CUS-003", "name": "Café Azul", "segment": "smb", "country": "PT"},
    {"id": "CUS-004", "name": "Kestrel Outdoor", "segment": "smb", "country": "GB"},
    {"id": "CUS-005", "name": "Maya Lindqvist", "segment": "consumer", "country": "SE"},
    {"id": "CUS-006", "name": "Pacific Rim Foods", "segment": "enterprise", "country": "SG"},
    {"id": "CUS-007", "name": "Atelier Brun", "segment": "smb", "country": "FR"},
]
INVOICES: list[dict[str, Any]] = [
    {"id": "INV-2024-0047", "customerId": "CUS-006", "amount": 18250.0, "currency": "USD", "status": "open", "dueDate": "2024-07-31"},
    {"id": "INV-2024-0046", "customerId": "CUS-001", "amount": 9400.5, "currency": "EUR", "status": "open", "dueDate": "2024-07-28"},
    {"id": "INV-2024-0045", "customerId": "CUS-003", "amount": 312.4, "currency": "EUR", "status": "paid", "dueDate": "2024-07-15"},
    {"id": "INV-2024-0044", "customerId": "CUS-002", "amount": 12780.0, "currency": "EUR", "status": "paid", "dueDate": "2024-07-10"},
    {"id": "INV-2024-0043", "customerId": "CUS-007", "amount": 1460.0, "currency": "EUR", "status": "void", "dueDate": "2024-07-02"},
    {"id": "INV-2024-0042", "customerId": "CUS-001", "amount": 22010.0, "currency": "EUR", "status": "paid", "dueDate": "2024-06-30"},
]
INVOICE_LINES: dict[str, list[dict[str, Any]]] = {
    "INV-2024-0042": [
        {"sku": "PAL-EUR-1200", "description": "Euro pallet 1200x800", "quantity": 400, "unitPrice": 14.5},
        {"sku": "FRT-SEA-TEU", "description": "Sea freight per TEU", "quantity": 8, "unitPrice": 2026.25},
    ],
}
PAYMENTS: list[dict[str, Any]] = [
    {"id": "PAY-9003", "invoiceId": "INV-2024-0045", "amount": 312.4, "method": "card", "receivedAt": "2024-07-14T09:12:00Z"},
    {"id": "PAY-9002", "invoiceId": "INV-2024-0044", "amount": 12780.0, "method": "sepa", "receivedAt": "2024-07-09T16:40:00Z"},
    {"id": "PAY-9001", "invoiceId": "INV-2024-0042", "amount": 22010.0, "method": "wire", "receivedAt": "2024-06-28T11:05:00Z"},
]
WAREHOUSES: list[dict[str, Any]] = [
    {"id": "WH-RTM", "city": "Rotterdam", "country": "NL", "capacityTons": 12000.0},
    {"id": "WH-HAM", "city": "Hamburg", "country": "DE", "capacityTons": 8500.0},
    {"id": "WH-SIN", "city": "Singapore", "country": "SG", "capacityTons": 15000.0},
]
STOCK: list[dict[str, Any]] = [
    {"sku": "PAL-EUR-1200", "name": "Euro pallet 1200x800", "warehouseId": "WH-RTM", "onHand": 1800, "reserved": 400},
    {"sku": "PAL-EUR-1200", "name": "Euro pallet 1200x800", "warehouseId": "WH-HAM", "onHand": 260, "reserved": 0},
    {"sku": "CRT-FLD-60", "name": "Foldable crate 60 l", "warehouseId": "WH-RTM", "onHand": 35, "reserved": 30},
    {"sku": "STR-PET-16", "name": "PET strapping 16 mm", "warehouseId": "WH-SIN", "onHand": 90, "reserved": 10},
    {"sku": "WRP-STR-500", "name": "Stretch wrap 500 mm", "warehouseId": "WH-HAM", "onHand": 12, "reserved": 0},
]
REORDER_POINTS = {"PAL-EUR-1200": 500, "CRT-FLD-60": 50, "STR-PET-16": 40, "WRP-STR-500": 20}
CONTACTS: list[dict[str, Any]] = [
    {"id": "CON-11", "customerId": "CUS-001", "name": "Joost de Vries", "email": "joost@rbt.example", "role": "Head of Procurement"},
    {"id": "CON-12", "customerId": "CUS-001", "name": "Anouk Smit", "email": "anouk@rbt.example", "role": "Accounts Payable"},
    {"id": "CON-21", "customerId": "CUS-002", "name": "Lena Vogt", "email": "l.vogt@nordlicht.example", "role": "Logistics Manager"},
    {"id": "CON-61", "customerId": "CUS-006", "name": "Wei Ling Tan", "email": "weiling@prf.example", "role": "Supply Chain Director"},
]
DEALS: list[dict[str, Any]] = [
    {"id": "DL-301", "customerId": "CUS-006", "title": "Reefer capacity Q4", "stage": "proposal", "value": 240000.0},
    {"id": "DL-302", "customerId": "CUS-002", "title": "Hamburg cross-dock", "stage": "qualified", "value": 86000.0},
    {"id": "DL-303", "customerId": "CUS-004", "title": "Retail replenishment", "stage": "lead", "value": 12000.0},
    {"id": "DL-304", "customerId": "CUS-001", "title": "Bulk grain 2025", "stage": "won", "value": 510000.0},
]
DOCS: list[dict[str, Any]] = [
    {"path": "ops/customs.md", "title": "Customs clearance checklist", "text": "1. Commercial invoice. 2. Packing list. 3. EORI number."},
    {"path": "ops/dangerous-goods.md", "title": "Dangerous goods (IMDG)", "text": "Class 3 liquids need a DG declaration 48 h before cut-off."},
    {"path": "finance/refunds.md", "title": "Refund policy", "text": "Refunds above EUR 5,000 need a second approver."},
    {"path": "sales/pricing.md", "title": "Freight pricing rules", "text": "Express adds 35 % to the standard lane rate."},
]
EVENTS: list[dict[str, Any]] = [
    {"id": "EV-1", "title": "Weekly ops sync", "start": "2024-07-22T08:00:00Z", "end": "2024-07-22T08:30:00Z", "attendees": ["ops@acme.example"]},
    {"id": "EV-2", "title": "Pacific Rim Foods QBR", "start": "2024-07-23T13:00:00Z", "end": "2024-07-23T14:00:00Z", "attendees": ["sales@acme.example", "weiling@prf.example"]},
    {"id": "EV-3", "title": "Customs audit prep", "start": "2024-07-25T10:00:00Z", "end": "2024-07-25T11:30:00Z", "attendees": ["ops@acme.example", "legal@acme.example"]},
]
TICKETS: list[dict[str, Any]] = [
    {"id": "TCK-311", "customerId": "CUS-003", "subject": "Pallet arrived damaged", "status": "open", "priority": "high"},
    {"id": "TCK-310", "customerId": "CUS-006", "subject": "Invoice currency wrong", "status": "pending", "priority": "normal"},
    {"id": "TCK-305", "customerId": "CUS-001", "subject": "Tracking page not updating", "status": "closed", "priority": "low"},
]
LANES = {("NLRTM", "SGSIN"): (118.0, 28), ("NLRTM", "USNYC"): (74.0, 11), ("DEHAM", "SGSIN"): (121.5, 30)}


def shipments() -> list[dict[str, Any]]:
    """The shipment rows of ``fixtures.shipments``."""
    return load_fixtures()["shipments"]
