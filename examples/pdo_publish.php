<?php
// Transactional enqueue with PHP PDO: the order row and its message commit together, or
// neither does (redrive on PostgreSQL; see docs/CONSUMERS.md, "Publish inside your own
// transaction").
//
//   php examples/pdo_publish.php
//
// Needs php-cli and php-pgsql (Debian), a redrive server that has opened the schema once
// (redrive serve --storage-url postgres://root@127.0.0.1:5432/test), and these settings:
//   PG_DSN          PDO DSN of the same database (default pgsql:host=127.0.0.1;port=5432;dbname=test;user=root)
//   REDRIVE_SCHEMA  redrive's schema, its storage_schema (default redrive)
//   APP_SCHEMA      where this example keeps its own table shop_orders (default public)
//   ORDER           the order number to pay (default 42); ORDER + 1 is the one rolled back

$dsn = getenv('PG_DSN') ?: 'pgsql:host=127.0.0.1;port=5432;dbname=test;user=root';
$redrive = getenv('REDRIVE_SCHEMA') ?: 'redrive';
$app = getenv('APP_SCHEMA') ?: 'public';
$order = (int) (getenv('ORDER') ?: 42);

$db = new PDO($dsn, null, null, [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);
$db->exec("CREATE TABLE IF NOT EXISTS $app.shop_orders (id bigint PRIMARY KEY, total numeric NOT NULL)");

// One statement, prepared once: the function answers the message id (or, for an
// idempotency key already used with the same payload, the first message's id).
$publish = $db->prepare(
    "SELECT $redrive.publish(queue => :queue, payload => CAST(:payload AS jsonb), key => :key, "
    . "idempotency_key => :ikey)"
);

// Record an order as paid and publish `order-paid` in the same transaction; roll back
// instead of committing when $commit is false (as a failure after the publish would).
function pay(PDO $db, PDOStatement $publish, string $app, int $order, bool $commit): string
{
    $db->beginTransaction();
    try {
        $db->prepare("INSERT INTO $app.shop_orders (id, total) VALUES (?, ?)")->execute([$order, '99.50']);
        $publish->execute([
            ':queue' => 'order-paid',
            ':payload' => json_encode(['order' => $order, 'total' => '99.50']),
            ':key' => "customer-$order",
            ':ikey' => "order-$order-paid",
        ]);
        $id = $publish->fetchColumn();
        $publish->closeCursor();
        if ($commit) {
            $db->commit();
        } else {
            $db->rollBack();
        }
        return $id;
    } catch (Throwable $e) {
        $db->rollBack();
        throw $e;
    }
}

$id = pay($db, $publish, $app, $order, true);
echo "committed order $order: message $id\n";
$gone = pay($db, $publish, $app, $order + 1, false);
echo "rolled back order " . ($order + 1) . ": no order, no message (it would have been $gone)\n";

// A refusal is an exception in the caller's transaction, naming the argument.
$db->beginTransaction();
try {
    $db->query("SELECT $redrive.publish('order-paid', '1', priority => 12)");
} catch (PDOException $e) {
    echo "refused: " . $e->errorInfo[0] . " " . explode("\n", $e->errorInfo[2])[0] . "\n";
}
$db->rollBack();
