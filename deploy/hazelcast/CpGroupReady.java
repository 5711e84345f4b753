// Waits until a CP group of the cluster grants a FencedLock, creating the group on the
// way: `java -cp hazelcast-5.4.0.jar CpGroupReady.java <cluster> <group> <host:port>...`.
//
// A CP group other than METADATA exists only once something uses it, and a new group
// answers nothing until it has elected its first leader: 2-3 s on a freshly started local
// cluster. scripts/services.sh runs this after starting the members, so that the first
// lock a payonce instance takes does not pay for the election (and, with a short
// PAYONCE_LOCK_WAIT, give up on it).
import com.hazelcast.client.HazelcastClient;
import com.hazelcast.client.config.ClientConfig;
import com.hazelcast.core.HazelcastInstance;
import com.hazelcast.cp.lock.FencedLock;
import java.util.concurrent.TimeUnit;

public class CpGroupReady {
    public static void main(String[] args) {
        if (args.length < 3) {
            System.err.println("usage: CpGroupReady <cluster> <cp-group> <host:port>...");
            System.exit(2);
        }
        ClientConfig config = new ClientConfig();
        config.setClusterName(args[0]);
        config.setProperty("hazelcast.logging.type", "none");
        for (int i = 2; i < args.length; i++) {
            config.getNetworkConfig().addAddress(args[i]);
        }
        config.getConnectionStrategyConfig().getConnectionRetryConfig().setClusterConnectTimeoutMillis(30_000);
        HazelcastInstance client = HazelcastClient.newHazelcastClient(config);
        try {
            // Lock names in a group are "<name>@<group>".
            FencedLock lock = client.getCPSubsystem().getLock("payonce-ready@" + args[1]);
            long fence = lock.tryLockAndGetFence(60, TimeUnit.SECONDS);
            if (fence == FencedLock.INVALID_FENCE) {
                System.err.println("the CP group " + args[1] + " granted no lock within 60 s");
                System.exit(1);
            }
            lock.unlock();
        } finally {
            client.shutdown();
        }
    }
}
