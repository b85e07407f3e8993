<?php
// A RabbitMQ consumer written the way the seed articles write them (php-amqplib), and NOT
// changed for redrive: it consumes the work queue with manual acks, rejects
// (requeue = false) the first N deliveries of each message (every delivery of a message
// whose id starts with "doomed"), and acks the next. Redrive's bridge sits behind the
// queue's dead-letter exchange; this script knows nothing of it.
//
//   php tests/php/amqp_consumer.php QUEUE FAIL_FIRST STOP_AFTER_DELIVERIES
//
// One JSON line per delivery on stdout: id, body, x-retry-count, content type, the
// "tenant" header, and whether it was acked. Exits after STOP_AFTER_DELIVERIES deliveries
// (or 60 s without one).
require_once 'PhpAmqpLib/autoload.php'; // Debian's php-amqplib, in PHP's include path

use PhpAmqpLib\Connection\AMQPStreamConnection;

[$_, $queue, $failFirst, $stopAfter] = $argv;
$failFirst = (int) $failFirst;
$stopAfter = (int) $stopAfter;

$conn = new AMQPStreamConnection('127.0.0.1', 5672, 'guest', 'guest');
$ch = $conn->channel();
$ch->basic_qos(null, 10, null);

$seen = [];
$deliveries = 0;
$onMessage = function ($msg) use (&$seen, &$deliveries, $failFirst) {
    $deliveries++;
    $props = $msg->get_properties();
    $id = $props['message_id'] ?? '';
    $seen[$id] = ($seen[$id] ?? 0) + 1;
    $headers = isset($props['application_headers'])
        ? $props['application_headers']->getNativeData()
        : [];
    $ack = strpos($id, 'doomed') !== 0 && $seen[$id] > $failFirst;
    echo json_encode([
        'id' => $id,
        'body' => $msg->getBody(),
        'retry_count' => $headers['x-retry-count'] ?? null,
        'content_type' => $props['content_type'] ?? null,
        'tenant' => $headers['tenant'] ?? null,
        'acked' => $ack,
    ]), "\n";
    if ($ack) {
        $msg->ack();
    } else {
        $msg->reject(false); // requeue = false: dead-lettered
    }
};

$ch->basic_consume($queue, '', false, false, false, false, $onMessage);
while ($ch->is_consuming() && $deliveries < $stopAfter) {
    $ch->wait(null, false, 60);
}
$ch->close();
$conn->close();
