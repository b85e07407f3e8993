<?php
// A plain PHP worker for redrive: php-cli with the curl extension (Debian: php-cli php-curl),
// no framework, no composer. It long-polls a queue, runs a handler per message, and acks, or
// nacks as transient / permanent / rate_limited (with retry_after), as the handler's outcome
// says. On SIGTERM or SIGINT (pcntl, built into Debian's php-cli) it finishes the message in
// hand, releases the ones it leased but did not start (ready again at once, no attempt
// charged) and exits 0. docs/CONSUMERS.md explains each choice made here.
//
//   REDRIVE_URL=http://127.0.0.1:7070 REDRIVE_QUEUE=orders php examples/php_worker.php
//
// Environment: REDRIVE_URL (default http://127.0.0.1:7070), REDRIVE_QUEUE (default orders),
// REDRIVE_TOKEN (a consume-scope token, when the server has tokens), REDRIVE_MAX (messages per
// lease, default 10), REDRIVE_WAIT (long poll, default "20s"), REDRIVE_LEASE (default "30s").
//
// One line per event on stdout ("leased 3", "processing ID attempt 1/20", "acked ID",
// "nacked ID transient", "released ID", "stopping", "stopped"), errors on stderr.

declare(strict_types=1);

if (!extension_loaded('curl')) {
    fwrite(STDERR, "php_worker: the curl extension is missing (Debian: apt-get install php-curl)\n");
    exit(2);
}

/** A failure worth retrying later on the queue's schedule (a timeout, a 503, a deadlock). */
class TransientError extends RuntimeException {}

/** A failure no retry will fix (a validation error, a 404): the message is dead at once. */
class PermanentError extends RuntimeException {}

/** The downstream said "not now" (HTTP 429): retry no earlier than $retryAfterSeconds. */
class RateLimitedError extends RuntimeException
{
    public function __construct(string $message, public readonly int $retryAfterSeconds)
    {
        parent::__construct($message);
    }
}

/**
 * The work. Replace this with yours; keep it idempotent: redrive delivers at least once, so
 * the same message can arrive twice (its lease expired while you worked, the worker died
 * between the work and the ack). Key your side effects on $message['id'] (or on the
 * business id in the payload): an upsert, a unique index, "already paid" checks.
 *
 * This demo decides its outcome from the payload's "simulate" field, so the example (and
 * its test, crates/redrive-server/tests/it/e2e_php_worker.rs) can show every path.
 */
function handle(array $payload, array $message): void
{
    $attempt = $message['attempt'];
    switch ($payload['simulate'] ?? 'ok') {
        case 'ok':
            return;
        case 'slow': // work that takes a while (the test stops the worker meanwhile)
            usleep(1_500_000);
            return;
        case 'transient_once': // a database timeout on the first try only
            if ($attempt === 1) {
                throw new TransientError('SQLSTATE[HY000]: database timeout');
            }
            return;
        case 'transient_always': // a downstream that never recovers: dead after max_attempts
            throw new TransientError('HTTP 503 from the payment service');
        case 'rate_limited_once': // a 429 with Retry-After: 1 on the first try
            if ($attempt === 1) {
                throw new RateLimitedError('HTTP 429 Too Many Requests', 1);
            }
            return;
        case 'permanent': // bad data: no retry will help
            throw new PermanentError('HTTP 422: order 0 does not exist');
        default:
            throw new PermanentError('unknown simulate value');
    }
}

final class Redrive
{
    /** @var CurlHandle one handle for every call: its connection is kept alive */
    private $curl;

    public function __construct(
        private string $base,
        private ?string $token,
        private int $waitSeconds,
    ) {
        $this->curl = curl_init();
    }

    /**
     * POST a JSON body; returns [status, decoded answer]. Throws on a transport failure.
     * The timeout covers the long poll: wait + 10 s of margin, or curl would give up on a
     * lease answer the server is still allowed to hold back.
     */
    public function post(string $path, array $body): array
    {
        // JSON_THROW_ON_ERROR: json_encode returns false on bad UTF-8 otherwise, and false
        // would be sent as an empty body. JSON_UNESCAPED_UNICODE keeps "中文" readable in the
        // console; JSON_PRESERVE_ZERO_FRACTION keeps 1.0 a float.
        $json = json_encode(
            $body,
            JSON_THROW_ON_ERROR | JSON_UNESCAPED_UNICODE | JSON_UNESCAPED_SLASHES | JSON_PRESERVE_ZERO_FRACTION
        );
        $headers = ['Content-Type: application/json', 'Expect:'];
        if ($this->token !== null && $this->token !== '') {
            $headers[] = 'Authorization: Bearer ' . $this->token;
        }
        curl_setopt_array($this->curl, [
            CURLOPT_URL => $this->base . $path,
            CURLOPT_POST => true,
            CURLOPT_POSTFIELDS => $json,
            CURLOPT_HTTPHEADER => $headers,
            CURLOPT_RETURNTRANSFER => true,
            CURLOPT_CONNECTTIMEOUT => 5,
            CURLOPT_TIMEOUT => $this->waitSeconds + 10,
        ]);
        $answer = curl_exec($this->curl);
        if ($answer === false) {
            throw new RuntimeException('redrive unreachable: ' . curl_error($this->curl));
        }
        $status = curl_getinfo($this->curl, CURLINFO_RESPONSE_CODE);
        // Decode to arrays. A payload {} comes back as [] this way; this worker never sends a
        // payload back, so it does not matter here (see docs/CONSUMERS.md for when it does).
        $decoded = $answer === '' ? [] : json_decode($answer, true, 512, JSON_THROW_ON_ERROR);
        return [$status, $decoded];
    }
}

/**
 * Settle a lease (ack, nack or release; $settled: "acked", "nacked" or "released"): POST, and
 * on a transport failure or a 503 (redrive or its database restarting, a deploy) send the same
 * request again, backing off, until the lease expires. A retried ack whose first try had
 * landed answers 200 again; a retried nack or release answers 409 lease_settled with that
 * $settled (docs/CONSUMERS.md, "When redrive answers 503"). Giving up at once would leave the
 * message to its lease: it would come back, and the expiry would count as a failed attempt.
 * Returns [landed, status, answer], or null once the lease has run out.
 */
function settle(Redrive $api, string $path, array $body, string $leaseExpiresAt, string $settled): ?array
{
    $until = (float) (new DateTimeImmutable($leaseExpiresAt))->format('U.u');
    $delay = 0.5;
    while (true) {
        try {
            [$status, $answer] = $api->post($path, $body);
            if ($status !== 503) {
                $landed = $status === 200 || ($answer['error']['settled'] ?? null) === $settled;
                return [$landed, $status, $answer];
            }
            $why = 'HTTP 503 ' . ($answer['error']['code'] ?? '');
        } catch (RuntimeException $e) {
            $why = $e->getMessage();
        }
        if (microtime(true) + $delay >= $until) {
            fwrite(STDERR, "$path: $why; the lease runs out before another try\n");
            return null;
        }
        fwrite(STDERR, "$path: $why; again in {$delay}s\n");
        usleep((int) ($delay * 1_000_000));
        $delay = min($delay * 2, 8.0);
    }
}

function env(string $name, string $default): string
{
    $v = getenv($name);
    return $v === false || $v === '' ? $default : $v;
}

function say(string $line): void
{
    fwrite(STDOUT, $line . "\n");
    fflush(STDOUT);
}

/** "20s" → 20 (the worker's own settings are whole seconds). */
function seconds(string $duration): int
{
    if (!preg_match('/^(\d+)s$/', $duration, $m)) {
        fwrite(STDERR, "php_worker: durations are whole seconds here, e.g. 20s (got $duration)\n");
        exit(2);
    }
    return (int) $m[1];
}

$base = rtrim(env('REDRIVE_URL', 'http://127.0.0.1:7070'), '/');
$queue = env('REDRIVE_QUEUE', 'orders');
$max = (int) env('REDRIVE_MAX', '10');
$wait = env('REDRIVE_WAIT', '20s');
$lease = env('REDRIVE_LEASE', '30s');
$api = new Redrive($base, getenv('REDRIVE_TOKEN') ?: null, seconds($wait));

// Graceful shutdown. The flag is only read between messages: the message in hand is
// finished (acked or nacked), the rest of the batch is released, and a long poll in flight is
// left to return (at most $wait): a lease answered to a connection we closed would stay
// leased until it expires, and then count as a failed attempt.
$stopping = false;
if (function_exists('pcntl_async_signals')) {
    pcntl_async_signals(true);
    $stop = function () use (&$stopping) {
        $stopping = true;
        say('stopping');
    };
    pcntl_signal(SIGTERM, $stop);
    pcntl_signal(SIGINT, $stop);
} else {
    fwrite(STDERR, "php_worker: no pcntl: SIGTERM ends the worker at once, its leases expire\n");
}

$backoff = 1;
while (!$stopping) {
    try {
        [$status, $answer] = $api->post("/v1/queues/$queue/leases", [
            'max' => $max,
            'lease' => $lease,
            'wait' => $wait,
        ]);
    } catch (RuntimeException $e) {
        fwrite(STDERR, $e->getMessage() . "; retrying in {$backoff}s\n");
        sleep($backoff);
        $backoff = min($backoff * 2, 30);
        continue;
    }
    if ($status !== 200) {
        fwrite(STDERR, "lease: HTTP $status " . json_encode($answer) . "; retrying in {$backoff}s\n");
        sleep($backoff);
        $backoff = min($backoff * 2, 30);
        continue;
    }
    $backoff = 1;
    $batch = $answer['messages'];
    if ($batch === []) {
        continue; // the long poll ran out: ask again
    }
    say('leased ' . count($batch));
    foreach ($batch as $i => $m) {
        if ($stopping) {
            // Hand back what we have not started: ready again now, the attempt not charged.
            foreach (array_slice($batch, $i) as $rest) {
                $r = settle($api, "/v1/messages/{$rest['id']}/release", ['lease' => $rest['lease']], $rest['lease_expires_at'], 'released');
                if ($r === null) {
                    continue; // its lease ran out: it is ready again already
                }
                [$landed, $st, $a] = $r;
                say($landed ? "released {$rest['id']}" : "release {$rest['id']}: HTTP $st {$a['error']['code']}");
            }
            break;
        }
        $last = $m['attempt'] === $m['max_attempts'] ? ' (last try)' : '';
        say("processing {$m['id']} attempt {$m['attempt']}/{$m['max_attempts']}$last");
        $error = null;
        try {
            handle(is_array($m['payload']) ? $m['payload'] : ['value' => $m['payload']], $m);
        } catch (RateLimitedError $e) {
            // retry_after goes inside "error", as a duration string.
            $error = ['class' => 'rate_limited', 'message' => $e->getMessage(), 'retry_after' => $e->retryAfterSeconds . 's'];
        } catch (PermanentError $e) {
            $error = ['class' => 'permanent', 'message' => $e->getMessage()];
        } catch (Throwable $e) {
            // Anything unexpected is transient: the policy retries it, and dead-letters it
            // after max_attempts if it keeps failing.
            $error = ['class' => 'transient', 'message' => get_class($e) . ': ' . $e->getMessage()];
        }
        if ($error === null) {
            $r = settle($api, "/v1/messages/{$m['id']}/ack", ['lease' => $m['lease']], $m['lease_expires_at'], 'acked');
            $done = "acked {$m['id']}";
        } else {
            $r = settle($api, "/v1/messages/{$m['id']}/nack", ['lease' => $m['lease'], 'error' => $error], $m['lease_expires_at'], 'nacked');
            $done = "nacked {$m['id']} {$error['class']}";
        }
        if ($r === null) {
            // Unsettled when its lease ran out: the message comes back (at-least-once),
            // which is why handle() must be idempotent.
            continue;
        }
        [$landed, $st, $a] = $r;
        if ($landed) {
            // 200, or a retry answered lease_settled for what the first try had done.
            say($done);
        } else {
            // 409 lease_expired / lease_settled / lease_mismatch: we took too long, or someone
            // else settled it. The work may be done twice; nothing to do but go on.
            $code = $a['error']['code'] ?? "http_$st";
            $how = isset($a['error']['settled']) ? " ({$a['error']['settled']})" : '';
            fwrite(STDERR, "{$m['id']}: $code$how: {$a['error']['message']}\n");
        }
    }
}
say('stopped');
exit(0);
