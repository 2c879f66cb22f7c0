// Five independent reads in parallel with Promise.all, then one summary.
const [invoices, customers, lowStock, warehouses, tickets] = await Promise.all([
  tools.callValue("host:billing:list_invoices", { status: "open" }),
  tools.callValue("host:crm:list_customers", {}),
  tools.callValue("host:inventory:inventory_list", { lowStockOnly: true }),
  tools.callValue("host:inventory:list_warehouses", {}),
  tools.callValue("host:support:list_tickets", { status: "open" }),
]);
const names = Object.fromEntries(customers.map((c) => [c.id, c.name]));
return {
  openInvoices: invoices.map((inv) => ({ id: inv.id, customer: names[inv.customerId], amount: inv.amount, currency: inv.currency })),
  lowStock: lowStock.map((s) => `${s.sku}@${s.warehouseId}`),
  capacityTons: warehouses.reduce((sum, w) => sum + w.capacityTons, 0),
  openTickets: tickets.map((t) => ({ id: t.id, customer: names[t.customerId], priority: t.priority })),
};
