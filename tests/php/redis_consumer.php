<?php
// A Redis Streams consumer written the way the seed articles write them (php-redis), and NOT
// changed for redrive: it reads its group with XREADGROUP and XACKs what it processed. It
// fails the first N reads of each order (by its "order" field) by not acking them, the way a
// worker that crashes or throws leaves an entry pending; every read of an order whose name
// starts with "doomed" fails. Redrive's bridge claims what stays pending too long; this script
// knows nothing of it.
//
//   php tests/php/redis_consumer.php STREAM GROUP FAIL_FIRST STOP_AFTER_READS
//
// One JSON line per read on stdout: the order, the entry id, its fields, whether it was acked.
// Exits after STOP_AFTER_READS reads (or 60 s without one).
[$_, $stream, $group, $failFirst, $stopAfter] = $argv;
$failFirst = (int) $failFirst;
$stopAfter = (int) $stopAfter;

$r = new Redis();
$r->connect('127.0.0.1', 6379);

$seen = [];
$reads = 0;
$idle = 0;
while ($reads < $stopAfter && $idle < 600) { // 600 x 100 ms
    $got = $r->xReadGroup($group, 'php-worker', [$stream => '>'], 10, 100);
    if (!$got || empty($got[$stream])) {
        $idle++;
        continue;
    }
    $idle = 0;
    foreach ($got[$stream] as $id => $fields) {
        $reads++;
        $order = $fields['order'] ?? '';
        $seen[$order] = ($seen[$order] ?? 0) + 1;
        $ack = strpos($order, 'doomed') !== 0 && $seen[$order] > $failFirst;
        echo json_encode(['id' => $order, 'entry' => $id, 'fields' => $fields, 'acked' => $ack]), "\n";
        if ($ack) {
            $r->xAck($stream, $group, [$id]);
        }
    }
}
