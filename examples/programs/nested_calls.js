// Ten dependent nested calls in one exec: each step uses the previous answer,
// so they stay sequential (never put dependent calls in Promise.all).
const customers = await tools.callValue("host:crm:list_customers", { segment: "enterprise" }); // 1
const accounts = [];
for (const c of customers) {
  const profile = await tools.callValue("host:crm:get_customer", { customerId: c.id }); // 2, 4, 6
  const open = await tools.callValue("host:billing:list_invoices", { customerId: c.id, status: "open" }); // 3, 5, 7
  accounts.push({
    id: c.id,
    name: profile.name,
    manager: profile.accountManager,
    openAmount: open.reduce((sum, inv) => sum + inv.amount, 0),
  });
}
const pallets = await tools.callValue("host:inventory:inventory_get_item", { sku: "PAL-EUR-1200" }); // 8
const quote = await tools.callValue("host:shipping:shipping_quote", {
  origin: "NLRTM",
  destination: "SGSIN",
  tons: pallets.reserved / 40,
}); // 9
const tracking = await tools.shipping_track({ shipmentId: "SHP-1004" }); // 10, convenience name
return {
  accounts: accounts.filter((a) => a.openAmount > 0),
  freePallets: pallets.onHand - pallets.reserved,
  quote: { id: quote.quoteId, price: quote.price, days: quote.transitDays },
  shipment: { id: tracking.shipmentId, status: tracking.status, last: tracking.events.at(-1).note },
};
