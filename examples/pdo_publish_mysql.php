<?php
// Transactional enqueue with PHP PDO on MySQL / MariaDB: the order row and its message
// commit together, or neither does (redrive on MariaDB 10.7+ or MySQL 8; see
// docs/CONSUMERS.md, "Publish inside your own transaction").
//
//   php examples/pdo_publish_mysql.php
//
// Needs php-cli and php-mysql (Debian: PDO's pdo_mysql driver), a redrive server that has
// opened its database once (redrive serve --storage-url mysql://root@127.0.0.1:3306/redrive),
// and these settings:
//   MYSQL_DSN         PDO DSN (default mysql:host=127.0.0.1;port=3306;dbname=redrive;charset=utf8mb4)
//   MYSQL_USER        (default root)    MYSQL_PASSWORD (default empty)
//   REDRIVE_DATABASE  redrive's database when it is not the DSN's (default: the DSN's)
//   APP_DATABASE      where this example keeps its own table shop_orders (default: the DSN's)
//   ORDER             the order number to pay (default 42); ORDER + 1 is the one rolled back

$dsn = getenv('MYSQL_DSN') ?: 'mysql:host=127.0.0.1;port=3306;dbname=redrive;charset=utf8mb4';
$user = getenv('MYSQL_USER') ?: 'root';
$password = getenv('MYSQL_PASSWORD') ?: '';
$redrive = getenv('REDRIVE_DATABASE') ? '`' . getenv('REDRIVE_DATABASE') . '`.' : '';
$app = getenv('APP_DATABASE') ? '`' . getenv('APP_DATABASE') . '`.' : '';
$order = (int) (getenv('ORDER') ?: 42);

$db = new PDO($dsn, $user, $password, [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);
$db->exec("CREATE TABLE IF NOT EXISTS {$app}shop_orders "
    . "(id BIGINT PRIMARY KEY, total DECIMAL(10, 2) NOT NULL) ENGINE=InnoDB");

// One statement, prepared once. Every argument is given (MySQL procedures have no
// defaults): queue, payload (JSON text), key, idempotency_key, delay_ms, priority,
// headers (a JSON object of strings); NULL for "none". It answers one row: the message id
// (or, for an idempotency key already used with the same payload, the first message's id).
$publish = $db->prepare("CALL {$redrive}redrive_publish(?, ?, ?, ?, ?, ?, ?)");

// Record an order as paid and publish `order-paid` in the same transaction; roll back
// instead of committing when $commit is false (as a failure after the publish would).
function pay(PDO $db, PDOStatement $publish, string $app, int $order, bool $commit): string
{
    $db->beginTransaction();
    try {
        $db->prepare("INSERT INTO {$app}shop_orders (id, total) VALUES (?, ?)")->execute([$order, '99.50']);
        $publish->execute([
            'order-paid',
            // Unescaped slashes and Unicode: the idempotency fingerprint compares strings as
            // written, and the HTTP path (and every JSON library but PHP's) writes them so.
            json_encode(['order' => $order, 'total' => '99.50', 'note' => 'paid / payé'],
                JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE | JSON_THROW_ON_ERROR),
            "customer-$order",   // per-key order, as over HTTP
            "order-$order-paid", // once, whichever path publishes
            null,                // delay_ms: ready now
            null,                // priority: 0
            json_encode(['trace-id' => bin2hex(random_bytes(8))]),
        ]);
        $id = $publish->fetchColumn();
        // A CALL answers its row and then a status: read both before the next statement.
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
    $db->query("CALL {$redrive}redrive_publish('order-paid', '1', NULL, NULL, NULL, 12, NULL)");
} catch (PDOException $e) {
    echo "refused: " . $e->errorInfo[0] . " " . $e->errorInfo[1] . " " . $e->errorInfo[2] . "\n";
}
$db->rollBack();
